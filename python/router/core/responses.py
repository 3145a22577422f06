"""What the client gets when something failed: OpenAI-shaped errors, whole or as an SSE event."""

from __future__ import annotations

import msgspec
from aiohttp import web

from router.core.failure import AttemptError, FailureKind
from router.errors import ApiError, UpstreamError, anthropic_error_body


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
    if b'"error"' not in body:
        return body
    try:
        doc = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return body
    if not isinstance(doc, dict) or doc.get("type") == "error":
        return body
    error = doc.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str):
        return body
    return anthropic_error_body(status, message)


def failure_response(
    exc: AttemptError, request_id: str, *, anthropic: bool = False
) -> web.Response:
    """What the client gets when every attempt failed: the last region's answer, or 502/504."""
    if exc.status is not None and exc.headers is not None:
        exc.headers["X-Request-Id"] = request_id
        body = exc.body
        if anthropic and body is not None and exc.status >= 400:
            body = anthropic_relayed(exc.status, body)
        return web.Response(status=exc.status, body=body, headers=exc.headers)
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
