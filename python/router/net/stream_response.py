"""A streamed answer whose status line and headers leave with its first body bytes."""

from __future__ import annotations

from aiohttp import web


class StreamResponse(web.StreamResponse):
    """aiohttp's StreamResponse, except that prepare() only buffers the headers: the first
    write() sends them and its bytes in one packet, so the client wakes once for both.

    Callers write as soon as they have bytes (the relay has the region's first chunk in hand),
    so holding the headers delays nothing. aiohttp's own whole-body Response works this way.
    """

    _send_headers_immediately = False
