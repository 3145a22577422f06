"""The upstream seam: what an attempt needs of a region's connection pool.

`router.net.http1.Pool` is the production implementation; `LocalTransport` answers in process,
so attempts, hedging and continuation can be driven by tests without sockets (httpx's
MockTransport plays the same part).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Protocol

from multidict import CIMultiDict, CIMultiDictProxy

from router.net.http1 import ClientError, ConnectError


class UpstreamBody(Protocol):
    """An answer's body as it arrives."""

    async def readany(self) -> bytes: ...
    def read_nowait(self) -> bytes: ...


class UpstreamResponse(Protocol):
    """One exchange with a region, once its status and headers arrived."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> CIMultiDictProxy[str]: ...
    @property
    def content(self) -> UpstreamBody: ...
    @property
    def content_length(self) -> int | None: ...
    def release(self) -> None: ...
    def close(self) -> None: ...


class Transport(Protocol):
    """Sends one request to a region."""

    async def post(
        self, path: str, body: bytes, headers: Iterable[tuple[str, str]], method: bytes = b"POST"
    ) -> UpstreamResponse:
        """Send `body` (with `method`, POST unless said) and return at the answer's head."""

    def retire(self) -> None:
        """Keep nothing idle from now on: a reload replaced this region's pool."""

    async def close(self) -> None: ...


class LocalReply:
    """What a LocalTransport handler answers: a status, headers and the body in pieces."""

    __slots__ = ("chunks", "headers", "status")

    def __init__(
        self,
        status: int,
        headers: dict[str, str] | None = None,
        chunks: AsyncIterator[bytes] | Iterable[bytes] = (),
    ) -> None:
        self.status = status
        self.headers = headers or {}
        self.chunks = chunks


Handler = Callable[[str, bytes, CIMultiDict[str]], Awaitable[LocalReply]]


class _LocalBody:
    __slots__ = ("_queue", "_task", "done")

    def __init__(self, chunks: AsyncIterator[bytes] | Iterable[bytes]) -> None:
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self.done = False
        self._task = asyncio.get_running_loop().create_task(self._pump(chunks))

    async def _pump(self, chunks: AsyncIterator[bytes] | Iterable[bytes]) -> None:
        try:
            if isinstance(chunks, AsyncIterator):
                async for chunk in chunks:
                    self._queue.put_nowait(chunk)
            else:
                for chunk in chunks:
                    self._queue.put_nowait(chunk)
            self._queue.put_nowait(None)
        except Exception as exc:  # a handler's failure is the connection breaking
            self._queue.put_nowait(exc)

    async def readany(self) -> bytes:
        if self.done:
            return b""
        item = await self._queue.get()
        if item is None:
            self.done = True
            return b""
        if isinstance(item, BaseException):
            self.done = True
            if isinstance(item, ConnectionError):
                raise ClientError(str(item) or type(item).__name__) from item
            raise item
        return item

    def read_nowait(self) -> bytes:
        out = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if not isinstance(item, bytes):
                # Keep the end (or the error) for the next readany().
                rest: list[bytes | BaseException | None] = [item]
                while not self._queue.empty():
                    rest.append(self._queue.get_nowait())
                for r in rest:
                    self._queue.put_nowait(r)
                break
            out.append(item)
        return b"".join(out)

    def stop(self) -> None:
        self._task.cancel()


class _LocalResponse:
    __slots__ = ("_body", "closed", "headers", "status")

    def __init__(self, reply: LocalReply) -> None:
        self.status = reply.status
        self.headers = CIMultiDictProxy(CIMultiDict(reply.headers))
        self._body = _LocalBody(reply.chunks)
        self.closed = False

    @property
    def content(self) -> _LocalBody:
        return self._body

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def release(self) -> None:
        self._body.stop()

    def close(self) -> None:
        self.closed = True
        self._body.stop()


class LocalTransport:
    """A region in process: `handler(path, body, headers)` answers each request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[str, bytes, CIMultiDict[str]]] = []
        self.responses: list[_LocalResponse] = []

    async def post(
        self, path: str, body: bytes, headers: Iterable[tuple[str, str]], method: bytes = b"POST"
    ) -> _LocalResponse:
        sent: CIMultiDict[str] = CIMultiDict(headers)
        self.requests.append((path, body, sent))
        try:
            reply = await self.handler(path, body, sent)
        except ConnectionRefusedError as exc:
            raise ConnectError(str(exc)) from None
        except ConnectionError as exc:
            # What the HTTP client says when the region hangs up before answering.
            raise ClientError(str(exc) or type(exc).__name__) from None
        response = _LocalResponse(reply)
        self.responses.append(response)
        return response

    def retire(self) -> None:
        return None

    async def close(self) -> None:
        for response in self.responses:
            response.release()
