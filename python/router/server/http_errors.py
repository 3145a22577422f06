"""What aiohttp answers before any handler runs, in OpenAI's error shape: a request it could not
parse, and an `Expect` header (100-continue only once the declared body fits)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, web, web_protocol, web_response, web_urldispatcher

from router.errors import ApiError, PayloadTooLarge

# A fixed message per status: the parser's own would echo the client's bytes back.
_UNPARSABLE = {
    400: "The request is not valid HTTP/1.1.",
    413: "The request is too large.",
    414: "The request line is too long.",
    431: "The request's header fields are too large or too many.",
}


# What the Server header says: no Python or aiohttp version for a scanner to match.
SERVER_HEADER = "router"


def install() -> None:
    """aiohttp's module defaults, the one place covering its own answers (written before any
    app hook runs): `Server` names no versions, and an unparsable request or an unknown
    `Expect` gets a JSON error (aiohttp's is text/plain). Call before any route is made."""
    web_response.SERVER_SOFTWARE = SERVER_HEADER  # type: ignore[attr-defined]
    web_protocol.RequestHandler.handle_error = _handle_error  # type: ignore[method-assign]
    # Every route made from now on without its own: 100-continue, or a JSON 417.
    web_urldispatcher._default_expect_handler = _continue  # type: ignore[assignment]


def _handle_error(
    self: web_protocol.RequestHandler,
    request: web.BaseRequest,
    status: int = 500,
    exc: BaseException | None = None,
    message: str | None = None,
) -> web.StreamResponse:
    """aiohttp's handle_error, answering in OpenAI's shape with the connection closed; logged
    as aiohttp logs it (observability.logs shortens that to one rate-limited line without the
    client's bytes)."""
    self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
    if request.writer.output_size > 0:
        # Part of an answer went out already: the connection is broken, as aiohttp says.
        raise ConnectionError("an answer was sent already; cannot send an error after it")
    if status >= 500:
        error = ApiError("Internal router error.", status=status)
    else:
        text = _UNPARSABLE.get(status, "The request could not be read.")
        error = ApiError(text, status=status, type="invalid_request_error", code="invalid_http")
    return _error(error)


ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def expect_handler(max_body: Callable[[], int]) -> ExpectHandler:
    """`Expect: 100-continue` answered with 100 only when the declared body fits `max_body()`
    (else the 413 now, before the client sends it); any other expectation is a 417 in OpenAI's
    shape."""

    async def expect(request: web.Request) -> web.StreamResponse | None:
        declared = request.content_length
        limit = max_body()
        if request.version == HttpVersion11 and declared is not None and declared > limit:
            return _error(
                PayloadTooLarge(f"Request body is {declared} bytes; the limit is {limit}.")
            )
        return await _continue(request)

    return expect


async def _continue(request: web.BaseRequest) -> web.StreamResponse | None:
    """aiohttp's default Expect handler, its 417 in OpenAI's shape."""
    if request.version != HttpVersion11:
        return None
    if request.headers.get("Expect", "").lower() != "100-continue":
        error = ApiError(
            "Only `Expect: 100-continue` is supported.",
            status=417,
            type="invalid_request_error",
            code="expectation_failed",
        )
        return _error(error)
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    # Not the answer's bytes (aiohttp's own handler resets the count too).
    request.writer.output_size = 0
    return None


def _error(error: ApiError) -> web.Response:
    """`error` in OpenAI's shape, the connection closed after it."""
    response = web.Response(status=error.status, body=error.body(), content_type="application/json")
    response.force_close()
    return response
