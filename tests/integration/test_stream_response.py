"""router.stream_response: a stream's headers leave with its first bytes, over a real socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from router.net.stream_response import StreamResponse
from tests.support import free_port

PAUSE = 0.3
EVENT = b"data: first\n\n"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def first_read(response_class: type[web.StreamResponse]) -> tuple[float, bytes, bytes]:
    """Serve one stream that pauses between prepare() and its first write; (seconds until the
    client's first read returned, what that read got, the whole response)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = response_class(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(PAUSE)
        await resp.write(EVENT)
        await resp.write_eof()
        return resp

    async with _serving(handle) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        began = loop.time()
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await reader.read(65536)
        waited = loop.time() - began
        whole = data + await reader.read()
        writer.close()
        return waited, data, whole


@contextlib.asynccontextmanager
async def _serving(handle: Handler) -> AsyncIterator[int]:
    """`handle` answering GET / on a free port of 127.0.0.1, for the block's length."""
    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


async def test_headers_wait_for_the_first_write_and_leave_with_it() -> None:
    waited, data, _ = await first_read(StreamResponse)
    assert waited >= PAUSE * 0.9
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"text/event-stream" in data
    assert EVENT in data


async def test_aiohttps_own_stream_response_sends_headers_at_prepare() -> None:
    # The contrast that makes the test above meaningful: without the subclass the client's
    # first read is the headers alone, before the pause ends.
    waited, data, _ = await first_read(web.StreamResponse)
    assert waited < PAUSE
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert EVENT not in data


@pytest.mark.parametrize("response_class", [StreamResponse, web.StreamResponse])
async def test_body_is_the_same_either_way(response_class: type[web.StreamResponse]) -> None:
    _, _, whole = await first_read(response_class)
    # Chunked framing of the one event and the terminator, whatever the packets were.
    assert whole.endswith(f"\r\n\r\n{len(EVENT):x}\r\n".encode() + EVENT + b"\r\n0\r\n\r\n")


async def test_an_http_1_0_stream_ends_with_its_connection() -> None:
    # HTTP/1.0 has no chunking, so the body ends where the connection does: a client asking
    # for keep-alive must not get it (its next answer would land inside this body).
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(EVENT)
        await resp.write_eof()
        return resp

    async with _serving(handle) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        whole = await asyncio.wait_for(reader.read(), 10)  # EOF: the router closed it
        writer.close()
    head, _, body = whole.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK\r\n")
    assert b"keep-alive" not in head.lower()
    assert body == EVENT
