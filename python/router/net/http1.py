"""A lean HTTP/1.1 client for the upstream leg: one keep-alive pool per region, llhttp parsing.

aiohttp's ClientSession cost about as much CPU per proxied request as the rest of the router's
core path (URL parsing, header objects, timers and stream readers built per request). This
client sends a request as one write on a pooled connection, parses the answer with httptools
(llhttp, the parser Node.js uses; chunked bodies arrive de-chunked) and hands the body out as it
arrives, with backpressure: a reader that falls behind pauses reading from the region.

Semantics kept from the aiohttp session it replaces: a pool of at most `limit` connections per
region (callers wait for a free one), idle connections dropped after `keepalive_s`, a connect
timeout, and a total deadline per request after which its reads raise TimeoutError. Closing a
response before its end closes the connection: that is what tells a region to stop generating.

An answer is exactly its own message: a chunked body's trailer fields are dropped (never headers
of this answer or the next), and bytes after the end of the answer (a second response, junk)
leave the answer as it was and close the connection, never reused. What is not body (the head,
chunk framing, trailers) is bounded by `max_head_bytes` between two pieces of body. Header
values are the UTF-8 text the region sent (written back, they are the same bytes); a value in
another encoding is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import ssl
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
# Body bytes buffered for a reader before reading from the region pauses (and resumes at 1/4).
_HIGH_WATER = 256 * 1024


class ClientError(Exception):
    """The exchange with the region failed: connection lost, invalid HTTP, pool closed."""


class ConnectError(ClientError):
    """No connection to the region could be opened."""


class TotalDeadline(TimeoutError):
    """The exchange passed the pool's total deadline (however much of it the reader spent
    elsewhere, e.g. writing to a slow client)."""


class HeadTooLarge(ClientError):
    """The region's response head (or its trailers) passed the pool's size or count bound."""


def _fresh(error: BaseException) -> BaseException:
    """A copy of an exchange's stored error, to raise: raised itself, it would hold in its
    traceback the frames that hold the body or response holding it, a cycle per failed
    exchange (with everything those frames hold) left to the cycle collector."""
    return copy.copy(error)


def _head_size(fields: list[tuple[bytes, bytes]]) -> int:
    """At least how many bytes a head with these fields took (`name: value` CR LF each)."""
    return sum(len(name) + len(value) + 4 for name, value in fields)


def _text_fields(fields: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """Header fields as text: a value in UTF-8 (which the router writes back as the same
    bytes); one in another encoding (latin-1, say), which nothing could pass on as it came, is
    dropped. Names are tokens (llhttp takes nothing else)."""
    out = []
    for name, value in fields:
        try:
            out.append((name.decode("latin-1"), value.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return out


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries at most one exchange at a time."""

    def __init__(self, pool: Pool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        # The loop it runs on, kept: asyncio.get_running_loop() costs a getpid() call each time.
        self.loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.idle_since = 0.0
        self.lost = False
        # Whether the pool already stopped counting this connection (it frees its slot once).
        self.forgotten = False
        # Exchanges sent on it, and whether any byte of the current one's answer arrived.
        self.uses = 0
        self.answered = False
        # Bytes received since the current answer began or its body last grew: its head, then
        # chunk framing and trailers. Bounded by the pool's max_head_bytes.
        self._gap = 0
        # Raw (name, value) pairs: decoded once the head is complete. Trailer fields land in a
        # fresh list, dropped when the answer completes (an exchange that does not complete
        # closes the connection).
        self._fields: list[tuple[bytes, bytes]] = []
        # The current exchange's body (set by send; no byte is parsed before it).
        self._body: Body

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.answered = True
        if self.response is None:
            # Bytes nobody asked for: the connection cannot be trusted with another request.
            self.abort()
            return
        self._gap += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A 101 (or CONNECT's 2xx): the region wants another protocol on this connection.
            self._fail(ClientError("the region switched protocols (HTTP 101)"))
            self.abort()
            return
        except httptools.HttpParserError as exc:
            self._broken(exc)
            return
        if self._gap > self._pool.max_head_bytes:
            self._overrun()

    def _broken(self, exc: httptools.HttpParserError) -> None:
        """The parser stopped: on bytes after the end of the answer, or on a broken one."""
        if not self._body.complete:
            cause = exc.__context__
            if isinstance(cause, HeadTooLarge):
                self._fail(cause)
            else:
                self._fail(ClientError(f"invalid HTTP from the region ({exc})"))
        # Else the answer ended before them (a second response, junk): it stays as it was,
        # and the connection, whose next bytes nobody can place, is never reused.
        self.abort()

    def _overrun(self) -> None:
        """More than max_head_bytes arrived without a byte of body: llhttp (or httptools, for a
        header or trailer field it has not finished) would hold them all."""
        if not self._body.complete:
            limit = self._pool.max_head_bytes
            self._fail(HeadTooLarge(f"the region's response {self._part()} passed {limit} bytes"))
        self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        response = self.response
        if response is not None and not response.complete:
            if exc is None and response.status and response.ends_at_close():
                response.finish(keep_alive=False)  # a body delimited by the end of the connection
            else:
                self._fail(ClientError(f"connection lost: {exc}" if exc else "connection lost"))
        self._pool.forget(self)
        # Nothing more arrives: the parser (which holds this protocol's callbacks) and the last
        # body (which holds this connection) go now, so a closed connection is freed by
        # refcounting, not left to the cycle collector.
        del self._parser
        vars(self).pop("_body", None)

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self._body.complete:
            # A message after the end of the answer, before the next request: not this answer's
            # (nor the next one's).
            raise ClientError("the region sent more than one answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        fields = self._fields
        if len(fields) >= self._pool.max_headers:
            limit = self._pool.max_headers
            raise HeadTooLarge(f"the region's response {self._part()} passed {limit} fields")
        fields.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        fields = self._fields
        self._fields = []
        if status < 200:
            self._gap = 0
            return  # 1xx: an interim answer; the real one follows
        limit = self._pool.max_head_bytes
        if self._gap > limit and _head_size(fields) > limit:
            # A head that arrived whole in one read (the check after each read never saw it
            # unfinished): measured here, by its fields.
            raise HeadTooLarge(f"the region's response head passed {limit} bytes")
        self._gap = 0
        response = self.response
        if response is not None:
            try:
                headers = CIMultiDict([(n.decode("ascii"), v.decode("ascii")) for n, v in fields])
            except UnicodeDecodeError:
                headers = CIMultiDict(_text_fields(fields))
            response.start(status, headers)

    def on_body(self, body: bytes) -> None:
        self._gap = 0
        self._body.feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None and response.status:
            if self._fields:
                # Trailer fields, dropped: bounded as the head is, also when they came whole in
                # the read that ended the body (the check after each read never saw them).
                limit = self._pool.max_head_bytes
                if _head_size(self._fields) > limit:
                    raise HeadTooLarge(f"the region's response trailers passed {limit} bytes")
                self._fields = []
            response.finish(self._parser.should_keep_alive())

    def _part(self) -> str:
        """Which part of the answer is arriving: its head, or its trailers after the body."""
        return "trailers" if self.response is not None and self.response.status else "head"

    # --

    def _fail(self, exc: Exception) -> None:
        if self.response is not None:
            self.response.fail(exc)

    def abort(self) -> None:
        """Close the connection now (no reuse)."""
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def send(self, data: bytes, response: Response) -> None:
        self.response = response
        self._body = response.content
        self.uses += 1
        self.answered = False
        self._gap = 0
        assert self.transport is not None
        self.transport.write(data)


class Body:
    """The body as it arrives: `readany()` waits for bytes, b"" at the end (which also gives the
    connection back to the pool, as aiohttp does once a body was read to its end).

    It holds no reference to its Response (which holds it): an exchange is freed by refcounting
    alone, never left to the cycle collector.
    """

    __slots__ = ("_buffer", "_conn", "_paused", "_size", "_waiter", "complete", "error")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._buffer: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.error: BaseException | None = None

    def feed(self, data: bytes) -> None:
        self._buffer.append(data)
        self._size += len(data)
        if self._size > _HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        # _wake(), inlined: this runs once per piece of a streamed body.
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def end(self, error: BaseException | None = None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.complete = self.complete or error is None
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def read_nowait(self) -> bytes:
        """Whatever is buffered now (b"" if nothing)."""
        if not self._buffer:
            return b""
        data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
        self._buffer.clear()
        self._size = 0
        self.unpause()
        return data

    def unpause(self) -> None:
        """Read from the region again (the buffer was drained, or the exchange is over)."""
        if self._paused and self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()

    async def readany(self) -> bytes:
        """The next bytes of the body; b"" once it ended; raises if it broke."""
        while not self._buffer:
            if self.error is not None:
                raise _fresh(self.error)
            if self.complete:
                # The reader has seen the end: the connection can serve the next request.
                response = self._conn.response
                if response is not None and response.content is self:
                    response.release()
                return b""
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.read_nowait()


class Response:
    """One exchange: status and headers once they arrived, then the body."""

    __slots__ = (
        "_conn",
        "_deadline",
        "_head",
        "_keep_alive",
        "_pool",
        "content",
        "headers",
        "status",
    )

    def __init__(self, pool: Pool, conn: _Connection, deadline: float | None) -> None:
        self._pool = pool
        self._conn = conn
        self._keep_alive = False
        self.status = 0
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        self.content = Body(conn)
        loop = conn.loop
        self._head: asyncio.Future[None] = loop.create_future()
        self._deadline = None if deadline is None else loop.call_at(deadline, self._expire)

    @property
    def complete(self) -> bool:
        return self.content.complete

    def ends_at_close(self) -> bool:
        """Whether the body is delimited by the connection closing (no length, not chunked)."""
        headers = self.headers
        return (
            "Content-Length" not in headers
            and "chunked" not in headers.get("Transfer-Encoding", "").lower()
        )

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def start(self, status: int, headers: CIMultiDict[str]) -> None:
        self.status = status
        self.headers = CIMultiDictProxy(headers)
        if not self._head.done():
            self._head.set_result(None)

    def finish(self, keep_alive: bool) -> None:
        self._keep_alive = keep_alive
        self.content.end()
        self._cancel_deadline()

    def fail(self, exc: BaseException) -> None:
        # The head's waiter (Pool.post) finds the error on the body: a future holding it would
        # raise it itself, into frames that hold this response (see _fresh).
        self.content.end(exc)
        if not self._head.done():
            self._head.set_result(None)
        self._cancel_deadline()

    def _expire(self) -> None:
        self._deadline = None
        self.fail(TotalDeadline("the request's total deadline passed"))
        self._conn.abort()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def release(self) -> None:
        """Done with it: the connection goes back to the pool if the answer ended cleanly."""
        self._cancel_deadline()
        conn = self._conn
        if conn.response is not self:
            return
        conn.response = None
        if self.complete and self._keep_alive and not conn.lost and not self.content.error:
            self.content.unpause()
            self._pool.put_back(conn)
        else:
            conn.abort()
            self._pool.forget(conn)

    def close(self) -> None:
        """Abandon the exchange: the connection is closed, the region sees the disconnect."""
        self._cancel_deadline()
        conn = self._conn
        if conn.response is self:
            conn.response = None
            conn.abort()
            self._pool.forget(conn)


class Pool:
    """Keep-alive connections to one origin (scheme://host:port), at most `limit` at once."""

    def __init__(
        self,
        base_url: str,
        *,
        limit: int,
        keepalive_s: float,
        connect_timeout: float | None,
        total_timeout: float | None,
        on_connect: Callable[[int], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_head_bytes: int = 64 * 1024,
        max_headers: int = 128,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {base_url!r}")
        default_port = 443 if url.scheme == "https" else 80
        self.host = url.hostname
        self.port = url.port or default_port
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port != default_port:
            host = f"{host}:{self.port}"
        self._host_header = host.encode("ascii")
        # https: the system's trust store and hostname checks, unless a context is given.
        self._ssl: ssl.SSLContext | None = None
        if url.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        self.limit = limit
        self.keepalive_s = keepalive_s
        self.connect_timeout = connect_timeout
        self.total_timeout = total_timeout
        self.on_connect = on_connect
        # A response head (status line and headers) over either bound fails the exchange.
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self._idle: list[_Connection] = []
        # The loop its connections run on, known from the first request.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed = False
        self.retiring = False
        # Requests sent again because a kept-alive connection turned out closed (see post).
        self.stale_retries = 0

    async def post(
        self, path: str, body: bytes, headers: Iterable[tuple[str, str]], method: bytes = b"POST"
    ) -> Response:
        """Send `body` to `path` and return once the answer's status and headers arrived.

        A kept-alive connection the region closed while it sat idle fails before any byte of
        an answer: that request is sent once more on a fresh connection (what browsers do), so
        the race costs neither the request nor the region's health.
        """
        loop = self._loop
        if loop is None:
            # Read once: asyncio.get_running_loop() costs a getpid() call (Python 3.11).
            loop = self._loop = asyncio.get_running_loop()
        deadline = None if self.total_timeout is None else loop.time() + self.total_timeout
        pairs = list(headers)
        fields = "".join([f"\r\n{name}: {value}" for name, value in pairs])
        if fields.isascii():
            block = fields.encode("ascii")  # the usual head: one encode, not two per field
        else:
            parts: list[bytes] = []
            for name, value in pairs:
                parts += (b"\r\n", name.encode("latin-1"), b": ")
                parts.append(value.encode("utf-8", "surrogateescape"))
            block = b"".join(parts)
        data = b"".join(
            (
                # POST, or another method for the few calls that are not (a stored response's GET).
                method,
                b" ",
                path.encode("utf-8", "surrogateescape"),
                b" HTTP/1.1\r\nHost: ",
                self._host_header,
                block,
                b"\r\nContent-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        conn = await self._acquire()
        while True:
            reused = conn.uses > 0
            response = Response(self, conn, deadline)
            try:
                conn.send(data, response)
                await response._head
                error = response.content.error
                if error is not None and not response.status:
                    raise _fresh(error)  # it failed before its head
            except ClientError:
                response.close()
                if not reused or conn.answered:
                    raise
                self.stale_retries += 1
                conn = await self._acquire(fresh=True)
                continue
            except BaseException:
                response.close()
                raise
            return response

    async def _acquire(self, fresh: bool = False) -> _Connection:
        if self.closed:
            raise ClientError("the region's connection pool is closed")
        now = time.monotonic()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.lost and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.abort()
            self.forget(conn)
        while self._open >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if self._idle and not fresh:
                return await self._acquire()
        self._open += 1
        try:
            return await self._connect()
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        began = time.perf_counter_ns()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, loop),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise ConnectError(f"connect to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        if self.on_connect is not None:
            self.on_connect(time.perf_counter_ns() - began)
        return conn

    def put_back(self, conn: _Connection) -> None:
        """A connection whose exchange ended cleanly, for the next request."""
        if self.closed or self.retiring:
            conn.abort()
            self.forget(conn)
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        self._wake_one()

    def forget(self, conn: _Connection) -> None:
        """A connection that is gone (closed by either side); frees its slot once."""
        if conn.forgotten:
            return
        conn.forgotten = True
        if conn in self._idle:
            self._idle.remove(conn)
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _drop_idle(self) -> None:
        for conn in list(self._idle):
            conn.abort()
            self.forget(conn)

    @property
    def idle_count(self) -> int:
        """Connections kept alive for the next request."""
        return len(self._idle)

    def retire(self) -> None:
        """Keep no connection idle from now on (a reload replaced this pool): those idle close
        now, in-flight ones when their exchange ends; a request that still uses the pool gets
        a fresh connection, closed after it."""
        self.retiring = True
        self._drop_idle()

    async def close(self) -> None:
        """Close idle connections; in-flight ones close when their exchange ends."""
        self.closed = True
        self._drop_idle()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(ClientError("the region's connection pool is closed"))
                waiter.exception()
        self._waiters.clear()
