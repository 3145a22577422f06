"""A streamed answer whose status line and headers leave with its first body bytes."""

from __future__ import annotations

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter

from router.net.whole import leanable, start


class StreamResponse(web.StreamResponse):
    """aiohttp's StreamResponse, except that prepare() only buffers the headers: the first
    write() sends them and its bytes in one packet, so the client wakes once for both.

    Callers write as soon as they have bytes (the relay has the region's first chunk in hand),
    so holding the headers delays nothing. aiohttp's own whole-body Response works this way.
    The usual stream (HTTP/1.1, chunked) is prepared in one step, by aiohttp's rules.
    """

    _send_headers_immediately = False

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self.prepared or not leanable(request, self):
            if not self.prepared and request.version < HttpVersion11:
                # HTTP/1.0 has no chunking: the body ends where the connection does. aiohttp
                # knows that but kept a client's keep-alive, leaving the body unframed.
                self.force_close()
            return await super().prepare(request)
        writer = request.writer
        writer.enable_chunking()
        self.headers["Transfer-Encoding"] = "chunked"
        self._must_be_empty_body = False
        await start(request, self, writer, True)
        await writer.write_headers(f"HTTP/1.1 {self.status} {self.reason}", self.headers)
        return writer
