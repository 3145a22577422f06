"""Errors the router answers with, in OpenAI's error shape."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec


class RouterError(Exception):
    """Root of the router's own exceptions."""


class ConfigError(RouterError):
    """A config file that cannot be used; the message names the file and the field."""


class StartupError(RouterError):
    """The router could not start (a port in use, a certificate that will not load): the
    message is the one line an operator needs."""


class ApiError(RouterError):
    """An error answered to the client as `{"error": {"message", "type", "code"}}`."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        # The connection closes after this answer (what follows on it cannot be read).
        self.close = close
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        if code is not None:
            self.code = code
        self.param = param
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> bytes:
        """The JSON body OpenAI clients expect."""
        return msgspec.json.encode(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )

    def anthropic_body(self) -> bytes:
        """The same error in Anthropic's shape (the /v1/messages endpoint)."""
        return anthropic_error_body(self.status, self.message)


# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}`, the type chosen by status."""
    kind = _ANTHROPIC_TYPES.get(status)
    if kind is None:
        kind = "invalid_request_error" if 400 <= status < 500 else "api_error"
    return msgspec.json.encode({"type": "error", "error": {"type": kind, "message": message}})


class InvalidRequest(ApiError):
    """400: the request body or a parameter is wrong."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(ApiError):
    """401: missing or unknown API key."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(ApiError):
    """403: the key may not use this model or endpoint."""

    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class NotFound(ApiError):
    """404: unknown model or path."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class StateNotFound(NotFound):
    """404: stored state (a Responses API response or item) this tenant did not make, worded as
    for an unknown id; `ref` is its id."""

    def __init__(
        self,
        ref: str,
        what: str = "Response",
        code: str = "response_not_found",
        param: str | None = None,
    ) -> None:
        super().__init__(f"{what} `{ref}` is not known to this router.", code=code, param=param)
        self.ref = ref


class PayloadTooLarge(ApiError):
    """413: body over the configured maximum."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(ApiError):
    """429: a per-key limit is exhausted; carries Retry-After."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class Unavailable(ApiError):
    """503: no region can take the request now."""

    status = 503
    type = "server_error"
    code = "no_healthy_region"


class UpstreamError(ApiError):
    """502/504: every attempt at the regions failed."""

    status = 502
    type = "server_error"
    code = "upstream_error"
