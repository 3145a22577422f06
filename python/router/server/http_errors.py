"""What aiohttp answers before any handler runs, in OpenAI's error shape: a request it could not
parse, and an `Expect` header (100-continue only once the declared body fits); and what its
connection does when its parser stops: a body being read fails at once, a request asking to
upgrade is the connection's last."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from itertools import islice

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
    `Expect` gets a JSON error (aiohttp's is text/plain); its connections watch what their
    parser queues (`_watching`). Call before any route is made; calling again changes nothing."""
    web_response.SERVER_SOFTWARE = SERVER_HEADER  # type: ignore[attr-defined]
    handler = web_protocol.RequestHandler
    handler.handle_error = _handle_error  # type: ignore[method-assign]
    if not getattr(handler.data_received, _WATCHING, False):
        # Around whatever is there (a bench's stamps), once.
        handler.data_received = _watching(handler.data_received)  # type: ignore[method-assign,assignment]
    # Every route made from now on without its own: 100-continue, or a JSON 417.
    web_urldispatcher._default_expect_handler = _continue  # type: ignore[assignment]


_WATCHING = "_router_watching"
Feed = Callable[[web_protocol.RequestHandler, bytes], None]


def _watching(feed: Feed) -> Feed:
    """`feed` (aiohttp's data_received), then a look at the messages it queued, if any."""

    def data_received(self: web_protocol.RequestHandler, data: bytes) -> None:
        messages = self._messages
        known = len(messages)
        feed(self, data)
        if len(messages) > known:
            _queued(self, known)

    setattr(data_received, _WATCHING, True)
    return data_received


def _queued(self: web_protocol.RequestHandler, start: int) -> None:
    """The messages aiohttp's parser queued from index `start` on.

    A parse error: the parser has dropped the body it was reading without ending it, so that
    body's reader would wait for bytes that never come (the handler's body deadline, a 408).
    It fails now as a body that does not decode fails (RequestPayloadError: a 400 and the
    connection closed, core.request.unreadable_body); the parser's own 400 stays queued,
    answered only should the connection outlive the answer in progress.

    A request asking to upgrade (`Connection: Upgrade` and an `Upgrade` header, or CONNECT;
    the router upgrades nothing): aiohttp's C parser stops at its end and drops the rest of
    the bytes that came with it (not for `websocket` or CONNECT, whose rest aiohttp keeps and
    parses once declined), so a request pipelined behind it in those bytes is never answered
    and its client waits. Its answer closes the connection instead
    (`Connection: close`, as if the client had asked), which tells a pipelining client to send
    the rest again (RFC 9112 9.3.2); nothing parsed after it is handled.
    """
    messages = self._messages
    for index in range(start, len(messages)):
        message, payload = messages[index]
        if isinstance(message, web_protocol._ErrInfo):
            _fail_bodies(self, index, message.exc)
        elif message.upgrade and not message.should_close:
            messages[index] = (message._replace(should_close=True), payload)


def _fail_bodies(self: web_protocol.RequestHandler, before: int, cause: BaseException) -> None:
    """Fail the body still being received (the request in its handler's hands, or one queued
    ahead of message `before`), as aiohttp fails one that does not decode."""
    bodies = [payload for _, payload in islice(self._messages, before)]
    if self._current_request is not None:
        bodies.append(self._current_request.content)
    for body in bodies:
        if not body.is_eof() and body.exception() is None:
            broken = web.RequestPayloadError("the request's framing is malformed after its head")
            body.set_exception(broken, cause)


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
