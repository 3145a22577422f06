"""What the client gets when something failed: OpenAI-shaped errors, whole or as an SSE event."""

from __future__ import annotations

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from router.core.failure import AttemptError, FailureKind
from router.core.stream import json_object
from router.errors import ApiError, RateLimited, UpstreamError, anthropic_error_body


def error_response(error: ApiError, request_id: str, *, anthropic: bool = False) -> web.Response:
    """An ApiError in OpenAI's shape (Anthropic's for the Messages API)."""
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id, **error.headers}
    body = error.anthropic_body() if anthropic else error.body()
    response = web.Response(status=error.status, body=body, headers=headers)
    if error.close:
        response.force_close()
    return response


def anthropic_relayed(status: int, body: bytes) -> bytes:
    """A region's error body in Anthropic's shape: servers that speak both APIs may answer
    errors OpenAI's way; one already in Anthropic's shape, or not an error, is left alone."""
    doc = json_object(body) if b'"error"' in body else None
    if doc is None or doc.get("type") == "error":
        return body
    error = doc.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str):
        return body
    return anthropic_error_body(status, message)


def _api_error(body: bytes) -> bool:
    """Whether an error body is in the APIs' error shape: `{"error": {"message": "...", ...}}`
    (OpenAI's; Anthropic's has it too)."""
    doc = json_object(body) if b'"error"' in body else None
    error = doc.get("error") if doc is not None else None
    return isinstance(error, dict) and isinstance(error.get("message"), str)


def _flat_error(body: bytes) -> bytes | None:
    """vLLM's error shape (`{"object": "error", "message", "type", "param", "code"}` at the
    top) in OpenAI's, its fields kept; None for any other body."""
    doc = json_object(body) if b'"object"' in body else None
    if doc is None or doc.get("object") != "error":
        return None
    message = doc.get("message")
    if not isinstance(message, str):
        return None
    fields = {name: doc.get(name) for name in ("type", "param", "code")}
    return msgspec.json.encode({"error": {"message": message, **fields}})


# Region headers an error of the router's own keeps: when to try again.
_RETRY_HEADERS = ("Retry-After", "retry-after-ms")


def _standin(status: int, headers: CIMultiDict[str]) -> ApiError:
    """The router's own error for a region's error answer that is no API error (a load
    balancer's HTML page, an empty body): its status class and Retry-After, never its text."""
    kept = {name: value for name in _RETRY_HEADERS if (value := headers.get(name)) is not None}
    if status == 429:
        message = "The region serving this model is rate limited (HTTP 429); retry later."
        return RateLimited(message, code="upstream_rate_limited", headers=kept)
    if 400 <= status < 500:
        message = f"The region refused the request (HTTP {status})."
        return ApiError(
            message,
            status=status,
            type="invalid_request_error",
            code="upstream_refused",
            headers=kept,
        )
    if status == 503:
        message = "No region could answer the request (last failure: HTTP 503, unavailable)."
        return UpstreamError(message, status=503, code="upstream_unavailable", headers=kept)
    if status == 504:
        message = "No region could answer the request (last failure: HTTP 504, gateway timeout)."
        return UpstreamError(message, status=504, code="upstream_timeout", headers=kept)
    message = f"No region could answer the request (last failure: HTTP {status})."
    return UpstreamError(message, headers=kept)


def region_error(
    status: int, headers: CIMultiDict[str], body: bytes, request_id: str, *, anthropic: bool = False
) -> web.Response:
    """A region's error answer (4xx/5xx, headers filtered, body scrubbed) as the client gets
    it: its body when it is an API error (vLLM's put in OpenAI's shape; Anthropic's shape on
    the Messages API), else the router's own error in the API's shape with the answer's status
    class and Retry-After, never the answer's text or other headers."""
    if not _api_error(body):
        flat = _flat_error(body)
        if flat is None:
            return error_response(_standin(status, headers), request_id, anthropic=anthropic)
        body = flat
        headers["Content-Type"] = "application/json"
    headers["X-Request-Id"] = request_id
    if anthropic:
        body = anthropic_relayed(status, body)
    return web.Response(status=status, body=body, headers=headers)


def refusal_response(
    status: int, headers: CIMultiDict[str], body: bytes, request_id: str, *, anthropic: bool = False
) -> web.Response | None:
    """A region's own error answer that is no failure (the attempts relay it: a 4xx, a 5xx no
    other region is asked about), when it is not JSON (an ingress's HTML 404 naming its hosts,
    an empty body, plain text): the router's own error in the API's shape with its status
    class and Retry-After, never its text or other headers; None for a JSON object (OpenAI's
    shape, vLLM's flat one, TGI's `{"error": "..."}`, FastAPI's `{"detail": ...}`: some API's
    error, the key already blanked), which is relayed as it came."""
    if json_object(body) is not None:
        return None
    return error_response(_standin(status, headers), request_id, anthropic=anthropic)


def failure_response(
    exc: AttemptError, request_id: str, *, anthropic: bool = False
) -> web.Response:
    """What the client gets when every attempt failed: the last region's answer (see
    `region_error`), or 502/504."""
    if exc.status is not None and exc.headers is not None:
        if exc.status >= 400:
            return region_error(exc.status, exc.headers, exc.body, request_id, anthropic=anthropic)
        exc.headers["X-Request-Id"] = request_id
        return web.Response(status=exc.status, body=exc.body, headers=exc.headers)
    status = 504 if exc.kind == FailureKind.TIMEOUT else 502
    # The region's host:port stays in the log (the attempt's line); the client learns only why.
    error = UpstreamError(
        f"No region could answer the request (last failure: {exc.kind.value}).",
        status=status,
        code="upstream_timeout" if status == 504 else "upstream_error",
    )
    return error_response(error, request_id, anthropic=anthropic)


def stream_error_event(message: str, code: str = "upstream_stream_error") -> bytes:
    """An SSE event OpenAI SDKs raise as an APIError, for a stream that broke mid-way."""
    body = UpstreamError(message, code=code).body()
    return b"data: " + body + b"\n\n"
