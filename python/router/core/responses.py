"""What the client gets when something failed: OpenAI-shaped errors, whole or as an SSE event."""

from __future__ import annotations

from aiohttp import web

from router.core.failure import AttemptError, FailureKind
from router.errors import ApiError, UpstreamError


def error_response(error: ApiError, request_id: str) -> web.Response:
    """An ApiError in OpenAI's shape."""
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id, **error.headers}
    return web.Response(status=error.status, body=error.body(), headers=headers)


def failure_response(exc: AttemptError, request_id: str) -> web.Response:
    """What the client gets when every attempt failed: the last region's answer, or 502/504."""
    if exc.status is not None and exc.headers is not None:
        exc.headers["X-Request-Id"] = request_id
        return web.Response(status=exc.status, body=exc.body, headers=exc.headers)
    status = 504 if exc.kind == FailureKind.TIMEOUT else 502
    # The region's host:port stays in the log (the attempt's line); the client learns only why.
    error = UpstreamError(
        f"No region could answer the request (last failure: {exc.kind.value}).",
        status=status,
        code="upstream_timeout" if status == 504 else "upstream_error",
    )
    return error_response(error, request_id)


def stream_error_event(message: str) -> bytes:
    """An SSE event OpenAI SDKs raise as an APIError, for a stream that broke mid-way."""
    body = UpstreamError(message, code="upstream_stream_error").body()
    return b"data: " + body + b"\n\n"
