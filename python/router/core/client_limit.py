"""Caps the requests one client IP may have in flight, so a single client cannot take the router."""

from __future__ import annotations

from router.errors import RateLimited


class InFlightPerIp:
    """Counts in-flight requests per peer address; 429 above `limit` (0 disables the cap)."""

    __slots__ = ("_counts", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def in_flight(self, ip: str) -> int:
        """Requests from `ip` being handled now."""
        return self._counts.get(ip, 0)

    def enter(self, ip: str) -> None:
        """Count one more request from `ip`, or 429 when it already has `limit` in flight."""
        current = self._counts.get(ip, 0)
        if current >= self.limit:
            raise RateLimited(
                f"Too many concurrent requests from your address (limit {self.limit}).",
                code="too_many_concurrent_requests",
                headers={"Retry-After": "1"},
            )
        self._counts[ip] = current + 1

    def leave(self, ip: str) -> None:
        """One request from `ip` ended."""
        left = self._counts[ip] - 1
        if left:
            self._counts[ip] = left
        else:
            del self._counts[ip]
