"""router.http1, the upstream client, against scripted servers on 127.0.0.1 (real sockets)."""

from __future__ import annotations

import asyncio
import gc
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from router.net import http1
from tests.support import free_port

# A scripted server: gets the request (head and body) and the stream to answer on.
Script = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """Answers each request on a connection with `script`; counts connections and requests."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                await self.script(request, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[tuple[Server, str]]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> tuple[Server, str]:
        server = Server(script)
        port = free_port()
        servers.append(await asyncio.start_server(server.handle, "127.0.0.1", port))
        return server, f"http://127.0.0.1:{port}/v1"

    yield start
    for s in servers:
        s.close()


def _pool(url: str, **kw: float) -> http1.Pool:
    args: dict[str, float] = {"limit": 4, "keepalive_s": 5.0, "connect_timeout": 2.0}
    args.update(kw)
    return http1.Pool(
        url,
        limit=int(args["limit"]),
        keepalive_s=args["keepalive_s"],
        connect_timeout=args["connect_timeout"],
        total_timeout=kw.get("total_timeout"),
    )


async def _read_all(resp: http1.Response) -> bytes:
    parts = []
    while chunk := await resp.content.readany():
        parts.append(chunk)
    return b"".join(parts)


def _answer(body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(
        h + b"\r\n" for h in headers
    )
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def test_request_bytes_keep_alive_and_content_length(serve) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(_answer(b'{"ok":1}', b"X-Region: a"))

    server, url = await serve(script)
    pool = _pool(url)
    for _ in range(3):
        resp = await pool.post("/v1/chat/completions", b'{"q":1}', [("Authorization", "Bearer k")])
        assert (resp.status, resp.headers["x-region"], resp.content_length) == (200, "a", 8)
        assert await _read_all(resp) == b'{"ok":1}'
        resp.release()
    assert server.connections == 1  # one keep-alive connection for all three
    port = url.split(":")[2].split("/")[0]
    assert server.requests[0] == (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:"
        + port.encode()
        + b"\r\nAuthorization: Bearer k\r\nContent-Length: 7\r\n\r\n"
        + b'{"q":1}'
    )
    await pool.close()
    assert pool.closed
    with pytest.raises(http1.ClientError, match="closed"):
        await pool.post("/x", b"", [])


async def test_chunked_body_arrives_dechunked_and_interim_1xx_is_skipped(serve) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"data: a\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")

    server, url = await serve(script)
    pool = _pool(url)
    resp = await pool.post("/v1/x", b"{}", [])
    assert resp.status == 200
    assert resp.content_length is None
    assert await _read_all(resp) == b"data: a\n\ndata: [DONE]\n\n"
    resp.release()
    resp = await pool.post("/v1/x", b"{}", [])
    assert await _read_all(resp) == b"data: a\n\ndata: [DONE]\n\n"
    resp.release()
    assert server.connections == 1


async def test_body_ended_by_close_and_connection_close_header(serve) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    server, url = await serve(script)
    pool = _pool(url)
    for _ in range(2):
        resp = await pool.post("/v1/x", b"{}", [])
        assert await _read_all(resp) == b"until the end"
        resp.release()
    assert server.connections == 2  # not reused after Connection: close


async def test_connection_lost_mid_body_is_an_error(serve) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()
        writer.transport.abort()

    _, url = await serve(script)
    pool = _pool(url)
    resp = await pool.post("/v1/x", b"{}", [])
    assert await resp.content.readany() == b"only part"
    with pytest.raises(http1.ClientError, match="connection lost"):
        await resp.content.readany()
    resp.close()


async def test_invalid_http_and_refused_connection(serve) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SMTP ready\r\n\r\n")

    _, url = await serve(script)
    with pytest.raises(http1.ClientError, match="invalid HTTP"):
        await _pool(url).post("/v1/x", b"{}", [])
    dead = _pool(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(http1.ConnectError, match="cannot connect"):
        await dead.post("/v1/x", b"{}", [])
    # The failed connect gave its slot back: the pool is not stuck at its limit.
    assert dead._open == 0


async def test_total_deadline_and_close_tells_the_server(serve) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()

    server, url = await serve(script)
    pool = _pool(url, total_timeout=0.2)
    resp = await pool.post("/v1/x", b"{}", [])
    assert await resp.content.readany() == b"first"
    with pytest.raises(TimeoutError):
        await resp.content.readany()
    resp.close()
    await asyncio.wait_for(server.closed.wait(), 5)

    server2, url2 = await serve(script)
    pool2 = _pool(url2)
    resp = await pool2.post("/v1/x", b"{}", [])
    resp.close()  # abandoned mid-body: the region sees the disconnect
    await asyncio.wait_for(server2.closed.wait(), 5)
    assert pool2._open == 0


async def test_limit_makes_callers_wait_for_a_connection(serve) -> None:  # type: ignore[no-untyped-def]
    gate = asyncio.Event()

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        await gate.wait()
        writer.write(_answer(b"{}"))

    server, url = await serve(script)
    pool = _pool(url, limit=1)

    async def one() -> bytes:
        resp = await pool.post("/v1/x", b"{}", [])
        body = await _read_all(resp)
        resp.release()
        return body

    tasks = [asyncio.create_task(one()) for _ in range(3)]
    await asyncio.sleep(0.1)
    assert server.connections == 1
    assert len(server.requests) == 1  # the others wait for the one connection
    gate.set()
    assert await asyncio.gather(*tasks) == [b"{}"] * 3
    assert server.connections == 1


async def test_a_slow_reader_pauses_the_region(serve) -> None:  # type: ignore[no-untyped-def]
    size = 4 << 20
    sent = asyncio.Event()

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()
        sent.set()

    _, url = await serve(script)
    pool = _pool(url)
    resp = await pool.post("/v1/x", b"{}", [])
    await asyncio.sleep(0.3)
    # Nothing read: the client buffered about its high-water mark and stopped reading, so the
    # rest sits in socket buffers and the region's write is still waiting.
    assert not sent.is_set()
    assert len(await _read_all(resp)) == size
    await asyncio.wait_for(sent.wait(), 5)
    resp.release()


def test_urls() -> None:
    assert _pool("https://api.example.com/v1").port == 443
    with pytest.raises(ValueError, match="http"):
        _pool("ftp://x")


async def test_a_body_read_to_its_end_frees_the_connection(serve) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(_answer(b"{}"))

    server, url = await serve(script)
    pool = _pool(url, limit=1)
    for _ in range(5):  # no release(): reading to the end is enough, as with aiohttp
        resp = await asyncio.wait_for(pool.post("/v1/x", b"{}", []), 5)
        assert await _read_all(resp) == b"{}"
    assert (server.connections, pool._open) == (1, 1)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed (key, certificate) for 127.0.0.1."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    args = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    args += ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        [*args, "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True
    )
    return key, cert


async def test_https_with_certificate_checks(certificate: tuple[Path, Path]) -> None:
    key, cert = certificate
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(_answer(b'{"tls":1}'))
        await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=server_ctx)
    try:
        url = f"https://127.0.0.1:{port}/v1"
        trusting = ssl.create_default_context(cafile=str(cert))
        opts: dict[str, float] = {"keepalive_s": 5, "connect_timeout": 5, "total_timeout": 10}
        # The system trust store does not know this certificate: refused, as a connect error.
        with pytest.raises(http1.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await http1.Pool(url, limit=2, **opts).post("/v1/x", b"{}", [])
        pool = http1.Pool(url, limit=2, **opts, ssl_context=trusting)
        resp = await pool.post("/v1/x", b"{}", [])
        assert await _read_all(resp) == b'{"tls":1}'
    finally:
        server.close()


async def test_a_stale_keep_alive_connection_is_retried_once_on_a_fresh_one(serve) -> None:  # type: ignore[no-untyped-def]
    """The region closed a kept-alive connection as the next request arrived: no byte of an
    answer came back, so the request goes once more on a new connection and succeeds."""
    per_connection: dict[int, int] = {}

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        key = id(writer)
        per_connection[key] = per_connection.get(key, 0) + 1
        if per_connection[key] == 2:
            writer.close()  # the idle-close race: the second request on a connection dies
            return
        writer.write(_answer(b'{"ok":1}'))

    server, url = await serve(script)
    pool = _pool(url)
    for _ in range(2):
        resp = await pool.post("/v1/chat/completions", b"{}", [])
        assert await _read_all(resp) == b'{"ok":1}'
        resp.release()
    assert pool.stale_retries == 1
    assert server.connections == 2
    assert len(server.requests) == 3
    await pool.close()


async def test_a_fresh_connection_or_a_partial_answer_is_never_sent_again(serve) -> None:  # type: ignore[no-untyped-def]
    async def close_at_once(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server, url = await serve(close_at_once)
    pool = _pool(url)
    with pytest.raises(http1.ClientError):
        await pool.post("/v1/chat/completions", b"{}", [])
    assert (pool.stale_retries, len(server.requests)) == (0, 1)
    await pool.close()

    count = 0

    async def half_answer_second(request: bytes, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        if count == 2:
            writer.write(b"HTTP/1.1 200 O")  # bytes of an answer came: not a stale connection
            await writer.drain()
            writer.close()
            return
        writer.write(_answer(b'{"ok":1}'))

    server, url = await serve(half_answer_second)
    pool = _pool(url)
    resp = await pool.post("/v1/chat/completions", b"{}", [])
    await _read_all(resp)
    resp.release()
    with pytest.raises(http1.ClientError):
        await pool.post("/v1/chat/completions", b"{}", [])
    assert (pool.stale_retries, len(server.requests)) == (0, 2)
    await pool.close()


@pytest.mark.parametrize(
    "head",
    [
        b"X-Big: " + b"a" * 200_000 + b"\r\n",  # one huge field, still arriving
        b"".join(b"X-%d: v\r\n" % i for i in range(300)),  # too many small ones
        b"X-Big: " + b"a" * 70_000 + b"\r\nContent-Length: 2\r\n\r\n{}",  # whole, one read
    ],
    ids=["size", "count", "whole"],
)
async def test_a_response_head_over_its_bounds_fails_the_exchange(serve, head: bytes) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n" + head)  # the bound must cut it
        await writer.drain()
        await asyncio.sleep(5)

    _, url = await serve(script)
    pool = http1.Pool(
        url, limit=2, keepalive_s=5, connect_timeout=2, total_timeout=10, max_head_bytes=65536
    )
    with pytest.raises(http1.HeadTooLarge):
        await pool.post("/v1/chat/completions", b"{}", [])
    await pool.close()


async def test_a_region_switching_protocols_fails_the_exchange_cleanly(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(5)

    _, url = await serve(script)
    pool = _pool(url)
    with pytest.raises(http1.ClientError, match="switched protocols"):
        await pool.post("/v1/chat/completions", b"{}", [])
    await pool.close()
    # Not asyncio's "Fatal error: protocol.data_received() call failed" with a traceback.
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def _chunked(body: bytes, trailer: bytes) -> bytes:
    """A chunked answer whose last chunk carries `trailer` (fields, each ending CR LF)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    return head + b"\r\n%x\r\n%s\r\n0\r\n" % (len(body), body) + trailer + b"\r\n"


async def test_trailer_fields_are_headers_of_no_answer(serve) -> None:  # type: ignore[no-untyped-def]
    """Trailers of one answer were the first header fields of the next one on the connection
    (another client's request, maybe): they belong to no answer."""

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        if request.endswith(b'{"n":1}'):
            writer.write(_chunked(b'{"a":1}', b"X-Leak: of the first\r\nX-Also: 1\r\n"))
        else:
            writer.write(_answer(b'{"b":2}', b"X-Own: second"))

    server, url = await serve(script)
    pool = _pool(url)
    first = await pool.post("/v1/x", b'{"n":1}', [])
    assert await _read_all(first) == b'{"a":1}'
    first.release()
    second = await pool.post("/v1/x", b'{"n":2}', [])
    assert await _read_all(second) == b'{"b":2}'
    second.release()
    assert "X-Leak" not in first.headers
    assert sorted(second.headers) == ["Content-Length", "Content-Type", "X-Own"]
    assert server.connections == 1  # trailers within the bounds: the connection is kept
    await pool.close()


@pytest.mark.parametrize("trailer", ["size", "count", "whole"])
async def test_trailers_over_the_head_bounds_fail_the_exchange(serve, trailer: str) -> None:  # type: ignore[no-untyped-def]
    """A trailer is bounded as a head is ([server] max_response_head_bytes, max_headers): a
    16 MiB one was held whole, then relayed as a header of the next answer."""

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        if len(server.requests) > 1:
            writer.write(_answer(b'{"b":2}'))
            return
        writer.write(_chunked(b'{"a":1}', b"")[:-2])  # the answer, up to its trailer
        if trailer == "size":  # one endless field, in pieces
            writer.write(b"X-Big: ")
            for _ in range(64):
                writer.write(b"a" * 16384)
                await writer.drain()
            writer.write(b"\r\n\r\n")
        elif trailer == "count":
            writer.write(b"".join(b"X-%d: v\r\n" % i for i in range(300)) + b"\r\n")
        else:  # whole, in the write that ends the body
            writer.write(b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        await writer.drain()

    server, url = await serve(script)
    pool = http1.Pool(
        url, limit=2, keepalive_s=5, connect_timeout=2, total_timeout=10, max_head_bytes=65536
    )
    resp = await pool.post("/v1/x", b"{}", [])
    with pytest.raises(http1.HeadTooLarge, match="trailers"):
        await _read_all(resp)
    resp.close()
    resp = await pool.post("/v1/x", b"{}", [])
    assert await _read_all(resp) == b'{"b":2}'
    assert "X-Big" not in resp.headers
    resp.release()
    assert server.connections == 2  # the one that sent them was not reused
    await pool.close()


@pytest.mark.parametrize(
    ("answer", "extra"),
    [
        (_answer(b'{"part":1}', b"X-Part: 1"), _answer(b'{"part":2}', b"X-Part: 2")),
        (_chunked(b'{"part":1}', b"X-Part: 1\r\n"), _answer(b'{"part":2}', b"X-Part: 2")),
        (_answer(b'{"part":1}', b"X-Part: 1"), b"HTTP/1.1 200 OK\r\nX-Part: 2\r\n"),
        (_answer(b'{"part":1}', b"X-Part: 1"), b"garbage\r\n"),
    ],
    ids=["second-answer", "after-chunked", "partial-head", "junk"],
)
async def test_bytes_after_the_answer_are_no_answer_and_close_the_connection(  # type: ignore[no-untyped-def]
    serve, answer: bytes, extra: bytes
) -> None:
    """Two answers to one request were glued into one body (and cached); a partial second
    head was left in the parser for the next request's answer."""

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        if len(server.requests) == 1:
            writer.write(answer + extra)
        else:
            writer.write(_answer(b'{"ok":3}', b"X-Part: 3"))

    server, url = await serve(script)
    pool = _pool(url)
    resp = await pool.post("/v1/x", b"{}", [])
    assert await _read_all(resp) == b'{"part":1}'  # its own message, nothing after it
    resp.release()
    if b"Transfer-Encoding" not in answer:
        assert resp.headers.getall("X-Part") == ["1"]
    resp = await pool.post("/v1/x", b"{}", [])
    assert (await _read_all(resp), resp.headers.getall("X-Part")) == (b'{"ok":3}', ["3"])
    resp.release()
    assert server.connections == 2  # never reused after them
    await pool.close()


async def test_header_values_are_the_utf8_text_the_region_sent_or_dropped(serve) -> None:  # type: ignore[no-untyped-def]
    """Decoded as latin-1, `café` in UTF-8 went out to clients as `cafÃ©` (aiohttp writes
    UTF-8); a latin-1 value cannot go out as the bytes it is, so it is not kept at all."""

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(_answer(b"{}", "X-Utf8: café".encode(), b"X-Latin: caf\xe9", b"X-Plain: a"))

    _, url = await serve(script)
    pool = _pool(url)
    resp = await pool.post("/v1/x", b"{}", [])
    assert await _read_all(resp) == b"{}"
    assert resp.headers["X-Utf8"].encode() == "café".encode()
    assert (resp.headers["X-Plain"], "X-Latin" in resp.headers) == ("a", False)
    await pool.close()


def _alive(kind: type) -> int:
    """How many objects of `kind` the collector tracks now."""
    return sum(1 for obj in gc.get_objects() if type(obj) is kind)


async def test_an_exchange_leaves_no_reference_cycle(serve) -> None:  # type: ignore[no-untyped-def]
    """Refcounting frees every answered exchange, read to its end or abandoned: a cycle per
    request would leave the collector tens of thousands of objects to find at a time (a pause
    of tens of ms)."""

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(_answer(b'{"ok":1}', b"X-Region: a"))

    _, url = await serve(script)
    pool = _pool(url)
    gc.collect()
    gc.disable()
    try:
        before = _alive(http1.Response)
        for _ in range(3):
            # Read to its end (the end gives the connection back), released again, closed.
            resp = await pool.post("/v1/x", b"{}", [])
            assert await _read_all(resp) == b'{"ok":1}'
            resp = await pool.post("/v1/x", b"{}", [])
            assert await _read_all(resp) == b'{"ok":1}'
            resp.release()
            resp = await pool.post("/v1/x", b"{}", [])
            resp.close()
        del resp
        assert _alive(http1.Response) == before
    finally:
        gc.enable()
    await pool.close()


async def test_a_closed_connection_leaves_no_reference_cycle(serve) -> None:  # type: ignore[no-untyped-def]
    """A region that closes every connection after its answer costs the collector nothing:
    each connection and its parser are freed by refcounting once it closed."""

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    _, url = await serve(script)
    pool = _pool(url)
    gc.collect()
    gc.disable()
    try:
        before = _alive(http1._Connection)
        for _ in range(3):
            resp = await pool.post("/v1/x", b"{}", [])
            assert await _read_all(resp) == b"until the end"
            resp.release()
        del resp
        await asyncio.sleep(0.05)  # the transports' closing callbacks
        assert _alive(http1._Connection) == before
    finally:
        gc.enable()
    await pool.close()


async def test_a_failed_exchange_leaves_no_reference_cycle(serve) -> None:  # type: ignore[no-untyped-def]
    """A failed exchange is freed by refcounting too: the error raised is never the one the
    exchange keeps (the raised one's traceback holds frames that hold the response, whose body
    would hold it back): a region that resets, stalls or answers junk costs the collector
    nothing, before its head or in its body."""

    async def script(request: bytes, writer: asyncio.StreamWriter) -> None:
        if request.startswith(b"POST /silent "):
            return  # the request's total deadline passes
        if request.startswith(b"POST /cut "):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf")
            await writer.drain()
        elif request.startswith(b"POST /fields "):
            writer.write(b"HTTP/1.1 200 OK\r\n" + b"X-Field: 1\r\n" * 200 + b"\r\n")
            await writer.drain()
        assert writer.transport is not None
        writer.transport.abort()

    _, url = await serve(script)
    pool = _pool(url, total_timeout=0.2)

    async def fail(path: str) -> str:
        try:
            resp = await pool.post(path, b"{}", [])
            try:
                await _read_all(resp)
            finally:
                resp.close()
        except (http1.ClientError, TimeoutError) as exc:
            return type(exc).__name__
        return "answered"

    gc.collect()
    gc.disable()
    try:
        before = (_alive(http1.Response), _alive(http1._Connection))
        for _ in range(3):
            assert await fail("/reset") == "ClientError"
            assert await fail("/cut") == "ClientError"
            assert await fail("/fields") == "HeadTooLarge"
            assert await fail("/silent") == "TotalDeadline"
        await asyncio.sleep(0.05)  # the transports' closing callbacks
        assert (_alive(http1.Response), _alive(http1._Connection)) == before
    finally:
        gc.enable()
    await pool.close()
