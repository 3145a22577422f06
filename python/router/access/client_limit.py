"""Caps the requests one client IP may have in flight, so a single client cannot take the router."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from router.errors import RateLimited

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InFlightPerIp:
    """Counts in-flight requests per peer address; 429 above `limit` (0 disables the cap)."""

    __slots__ = ("_counts", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def in_flight(self, ip: str) -> int:
        """Requests from `ip` being handled now."""
        return self._counts.get(ip, 0)

    def middleware(self) -> Middleware:
        """An aiohttp middleware enforcing the cap around every request."""
        counts = self._counts

        @web.middleware
        async def cap(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self.limit <= 0:
                return await handler(request)
            ip = request.remote or "-"
            current = counts.get(ip, 0)
            if current >= self.limit:
                raise RateLimited(
                    f"Too many concurrent requests from your address (limit {self.limit}).",
                    code="too_many_concurrent_requests",
                    headers={"Retry-After": "1"},
                )
            counts[ip] = current + 1
            try:
                return await handler(request)
            finally:
                left = counts[ip] - 1
                if left:
                    counts[ip] = left
                else:
                    del counts[ip]

        return cap
