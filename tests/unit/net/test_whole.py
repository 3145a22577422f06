"""send_whole and the router's StreamResponse: the same bytes on the wire as aiohttp's own
prepare(), write() and write_eof(), in fewer steps."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from router.net.stream_response import StreamResponse
from router.net.whole import send_whole

CASES: dict[str, Callable[[], web.Response]] = {
    "json": lambda: web.Response(
        body=b'{"ok":true}', headers={"Content-Type": "application/json", "X-Request-Id": "r1"}
    ),
    "empty": lambda: web.Response(status=200, body=b""),
    "untyped": lambda: web.Response(body=b"raw bytes"),
    "limited": lambda: web.Response(
        status=429,
        body=b'{"error":{}}',
        headers={"Content-Type": "application/json", "Retry-After": "1"},
    ),
    "no-content": lambda: web.Response(status=204),
}


async def _hook(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Hook"] = "prepared" if response.prepared else "not prepared"


def _app(lean_taken: list[str]) -> web.Application:
    async def plain(request: web.Request) -> web.StreamResponse:
        return CASES[request.match_info["case"]]()

    async def lean(request: web.Request) -> web.StreamResponse:
        answer = CASES[request.match_info["case"]]()
        prepare = answer.prepare

        async def counted(req: web.BaseRequest) -> object:
            lean_taken.remove(request.match_info["case"])  # aiohttp's path after all
            return await prepare(req)

        lean_taken.append(request.match_info["case"])
        answer.prepare = counted  # type: ignore[method-assign]
        await send_whole(request, answer)
        answer.prepare = prepare  # type: ignore[method-assign]
        return answer

    async def stream(request: web.Request) -> web.StreamResponse:
        case = request.match_info["case"]
        headers = {"Content-Type": "text/event-stream"} if case == "sse" else {}
        kind = StreamResponse if request.match_info["kind"] == "lean" else web.StreamResponse
        answer = kind(headers=headers)
        await answer.prepare(request)
        if case != "empty":
            await answer.write(b"data: 1\n\n")
            await answer.write(b"data: [DONE]\n\n")
        await answer.write_eof()
        return answer

    app = web.Application()
    app.router.add_post("/plain/{case}", plain)
    app.router.add_post("/lean/{case}", lean)
    app.router.add_post("/stream/{kind}/{case}", stream)
    app.on_response_prepare.append(_hook)
    return app


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, list[str]]]:
    taken: list[str] = []
    runner = web.AppRunner(_app(taken), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port, taken
    finally:
        await runner.cleanup()


async def _exchange(port: int, path: str, version: str, close: bool) -> bytes:
    """The raw answer to one POST (the connection closed after it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Length: 0\r\n"
    head += "Connection: close\r\n" if close else ""
    writer.write(head.encode() + b"\r\n")
    await writer.drain()
    if close or version == "1.0":
        raw = await asyncio.wait_for(reader.read(), 5)
    else:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = re.search(rb"Content-Length: (\d+)", raw)
        raw += await reader.readexactly(int(length.group(1)) if length else 0)
    writer.close()
    return re.sub(rb"Date: [^\r]*", b"Date: -", raw)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("version", "close"), [("1.1", False), ("1.1", True), ("1.0", False)])
async def test_the_same_bytes_as_aiohttps_own_send(
    server: tuple[int, list[str]], case: str, version: str, close: bool
) -> None:
    port, taken = server
    plain = await _exchange(port, f"/plain/{case}", version, close)
    lean = await _exchange(port, f"/lean/{case}", version, close)
    assert lean == plain
    assert b"X-Hook: prepared" in lean  # the app's on_response_prepare hooks ran, once
    assert lean.count(b"X-Hook") == 1
    # The usual answer took the one-step path; a 204 and HTTP/1.0 take aiohttp's.
    assert (taken == [case]) == (version == "1.1" and case != "no-content")


@pytest.mark.parametrize("case", ["sse", "untyped", "empty"])
@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_a_stream_has_the_same_bytes_as_aiohttps_own(
    server: tuple[int, list[str]], case: str, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ = server
    started: list[type] = []
    own_start = web.StreamResponse._start

    async def counted(self: web.StreamResponse, request: web.BaseRequest) -> object:
        started.append(type(self))
        return await own_start(self, request)

    monkeypatch.setattr(web.StreamResponse, "_start", counted)
    plain = await _exchange(port, f"/stream/plain/{case}", version, close=True)
    lean = await _exchange(port, f"/stream/lean/{case}", version, close=True)
    assert lean == plain
    assert b"X-Hook: prepared" in lean
    assert lean.count(b"X-Hook") == 1
    # HTTP/1.1 streams take the one-step path; HTTP/1.0 (no chunking) takes aiohttp's.
    assert started == (
        [web.StreamResponse] if version == "1.1" else [web.StreamResponse, StreamResponse]
    )


async def test_an_answer_after_a_sent_one_never_follows_it_on_the_connection() -> None:
    # Bookkeeping that fails after the send (the pipeline's _finish, say) makes a middleware
    # answer 500: as after aiohttp's own write_eof(), that answer goes nowhere, and the next
    # request on the connection gets its own answer, not the stale 500.
    @web.middleware
    async def errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except RuntimeError:
            return web.json_response({"error": "internal"}, status=500)

    async def handle(request: web.Request) -> web.StreamResponse:
        answer = web.json_response({"ok": True})
        await send_whole(request, answer)
        if request.headers.get("X-Fail"):
            raise RuntimeError("after the send")
        return answer

    app = web.Application(middlewares=[errors])
    app.router.add_post("/", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        heads = []
        for fail in ("X-Fail: 1\r\n", ""):
            writer.write(f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n{fail}\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = re.search(rb"Content-Length: (\d+)", head)
            assert length is not None
            await reader.readexactly(int(length.group(1)))
            heads.append(head.split(b"\r\n")[0])
        writer.close()
    finally:
        await runner.cleanup()
    assert heads == [b"HTTP/1.1 200 OK"] * 2
