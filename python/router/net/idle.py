"""IdleWatch: a stream's idle timeout at the cost of a clock read per chunk, not a timer each."""

from __future__ import annotations

import asyncio
import math
from types import TracebackType


class IdleWatch:
    """Raises TimeoutError in the task once one wait for bytes lasts `limit` seconds.

    Only the spans between `waiting()` and `busy()` count: time spent writing to a slow client
    is backpressure, not an idle region. Rescheduling a timer around every chunk costs two heap
    operations and a handle per chunk; this keeps one timer that, when it fires early, moves
    itself to the current wait's deadline (the lazy timer of Envoy's and nginx's idle timeouts).

        async with IdleWatch(30.0) as watch:
            while chunk := ...:
                watch.waiting()
                chunk = await body.readany()
                watch.busy()
    """

    __slots__ = ("_handle", "_limit", "_loop", "_since", "_timeout")

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._since: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._timeout = asyncio.timeout(None)

    async def __aenter__(self) -> IdleWatch:
        self._loop = asyncio.get_running_loop()
        await self._timeout.__aenter__()
        if math.isfinite(self._limit):
            self._handle = self._loop.call_at(self._loop.time() + self._limit, self._check)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        # Turns the cancel this watch caused into TimeoutError; other exceptions pass through.
        await self._timeout.__aexit__(exc_type, exc, tb)

    def waiting(self) -> None:
        """A wait for bytes starts now."""
        self._since = self._loop.time()

    def busy(self) -> None:
        """The wait ended (bytes came); what follows is not idle time."""
        self._since = None

    def _check(self) -> None:
        now = self._loop.time()
        since = self._since
        if since is not None and now - since >= self._limit:
            self._handle = None
            self._timeout.reschedule(now)  # due now: the task is cancelled, exits on TimeoutError
            return
        # Early (bytes came since it was set), or busy: the earliest this wait could expire.
        due = (now if since is None else since) + self._limit
        self._handle = self._loop.call_at(due, self._check)
