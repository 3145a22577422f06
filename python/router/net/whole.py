"""Answers prepared by the router itself, as aiohttp would, in fewer steps: send_whole writes a
whole answer's status line, headers and body at once; `start` holds the header rules."""

from __future__ import annotations

from aiohttp import web, web_response
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import HttpVersion11
from aiohttp.http_writer import StreamWriter, _serialize_headers

# aiohttp's own parts this reaches for (3.11 and later have them all); without one, every answer
# takes aiohttp's prepare() and write_eof() instead.
_LEAN = all(
    hasattr(owner, name)
    for owner, name in (
        (web.Request, "_prepare_hook"),
        (web.Request, "writer"),
        (StreamWriter, "_writelines"),
        (StreamWriter, "_eof"),
        (web.Response, "_eof_sent"),
        (web.Response, "_body_length"),
        (web.Response, "_compression"),
        (web.Response, "_cookies"),
        (web_response, "SERVER_SOFTWARE"),
    )
)


def leanable(request: web.BaseRequest, answer: web.StreamResponse) -> bool:
    """Whether `answer` is the usual one, whose headers follow the rules of `start`: HTTP/1.1,
    a method and status with a body, no Content-Length, cookies, compression or chunking of its
    own."""
    status = answer.status
    return (
        _LEAN
        and request.version == HttpVersion11
        and request.method not in ("HEAD", "CONNECT")
        and status >= 200
        and status not in (204, 304)
        and not answer._chunked
        and not answer._compression
        and not answer._cookies
        and answer._keep_alive is None
        and "Content-Length" not in answer.headers
    )


async def start(
    request: web.BaseRequest, answer: web.StreamResponse, writer: AbstractStreamWriter, body: bool
) -> None:
    """aiohttp's header rules for a `leanable` answer (Content-Type's default when it has a
    `body`, Date, Server, `Connection: close` when the connection ends), then the app's
    on_response_prepare hooks; the answer counts as prepared from here on."""
    headers = answer.headers
    if body:
        headers.setdefault("Content-Type", "application/octet-stream")
    if "Date" not in headers:
        headers["Date"] = rfc822_formatted_time()
    headers.setdefault("Server", web_response.SERVER_SOFTWARE)  # type: ignore[attr-defined]
    keep_alive = answer._keep_alive = request.keep_alive
    if not keep_alive and "Connection" not in headers:
        headers["Connection"] = "close"
    # Prepared from here on, as aiohttp's own _start() marks it before the hooks run.
    answer._payload_writer = writer
    answer._req = request
    await request._prepare_hook(answer)


async def send_whole(request: web.Request, answer: web.Response) -> None:
    """Send `answer` (not yet prepared) to the client now, as aiohttp's prepare() and
    write_eof() would, byte for byte, in fewer steps.

    The usual answer (HTTP/1.1, a bytes body, a status with a body, no Content-Length,
    cookies, compression or chunking of its own) gets aiohttp's header rules inline:
    Content-Length, Content-Type's default, Date, Server, `Connection: close` when the
    connection ends, then the app's on_response_prepare hooks, then one write of head and
    body. Anything else goes through aiohttp. A client that left raises ConnectionError.
    """
    body = answer._body
    if type(body) is not bytes or not leanable(request, answer):
        await answer.prepare(request)
        await answer.write_eof()
        return
    headers = answer.headers
    headers["Content-Length"] = str(len(body))
    writer = request.writer
    await start(request, answer, writer, bool(body))
    head = _serialize_headers(f"HTTP/1.1 {answer.status} {answer.reason}", headers)
    # A closed connection raises here; aiohttp's own write_eof() then finds that out too.
    writer._writelines((head, body))  # type: ignore[attr-defined]
    await writer.drain()
    # Ended as aiohttp's write_eof() leaves them: an answer the app produces after this one
    # (a middleware's error answer, say) is not written behind it on the connection.
    writer._eof = True  # type: ignore[attr-defined]
    answer._eof_sent = True
    answer._req = None
    answer._payload_writer = None
    answer._body_length = writer.output_size  # as aiohttp counts it: head and body
