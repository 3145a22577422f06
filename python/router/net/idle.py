"""Timeouts for one task lighter than asyncio.timeout: a fixed deadline (Deadline) and a
stream's idle timeout at the cost of a clock read per chunk, not a timer each (IdleWatch)."""

from __future__ import annotations

import asyncio
import math
from types import TracebackType


class _TaskTimer:
    """asyncio.timeout's rule without its Timeout object: the timer cancels the task, and the
    cancel it caused leaves the block as TimeoutError (other exceptions pass through)."""

    __slots__ = ("_cancelling", "_expired", "_given", "_handle", "_loop", "_task")

    # The running loop when the caller knows it (each subclass sets it first thing):
    # asyncio.current_task() finds it itself at the cost of a getpid() call on Python 3.11.
    _given: asyncio.AbstractEventLoop | None

    def _enter(self) -> asyncio.AbstractEventLoop:
        task = asyncio.current_task(self._given)
        if task is None:
            raise RuntimeError(f"{type(self).__name__} must be used inside a task")
        self._task: asyncio.Task[object] | None = task
        self._cancelling = task.cancelling()
        self._expired = False
        self._handle: asyncio.TimerHandle | None = None
        loop = self._loop = task.get_loop()
        return loop

    def _expire(self) -> None:
        self._handle = None
        task = self._task
        if task is None:
            return  # a timer set again after its block ended (`reset`): no task to stop
        self._expired = True
        task.cancel()  # the task leaves its wait; __aexit__ makes it TimeoutError

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task, self._task = self._task, None
        expired = self._expired and task is not None and task.uncancel() <= self._cancelling
        # Not kept past the block (nor in this frame, which the TimeoutError holds): a task
        # that ends with an error raised in it (a hedge's attempt) keeps that error, whose
        # frames hold this timer: a cycle per failed attempt.
        del task
        if expired and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


class Deadline(_TaskTimer):
    """Raises TimeoutError in the task once `delay` seconds passed, unless lifted first.

    async with Deadline(5.0) as deadline:  # or Deadline(5.0, loop), the running loop
        head = await send()
        deadline.lift()  # what follows has bounds of its own
        body = await read()
    """

    __slots__ = ("_delay",)

    def __init__(self, delay: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._given = loop
        self._delay = delay

    async def __aenter__(self) -> Deadline:
        loop = self._enter()
        if math.isfinite(self._delay):
            self._handle = loop.call_at(loop.time() + self._delay, self._expire)
        return self

    def lift(self) -> None:
        """No deadline from now on."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def reset(self, delay: float) -> None:
        """The deadline is `delay` seconds from now instead (none if it is infinite)."""
        self.lift()
        if math.isfinite(delay):
            self._handle = self._loop.call_at(self._loop.time() + delay, self._expire)


class IdleWatch(_TaskTimer):
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

    __slots__ = ("_limit", "_since")

    def __init__(self, limit: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._given = loop
        self._limit = limit
        self._since: float | None = None

    async def __aenter__(self) -> IdleWatch:
        loop = self._enter()
        if math.isfinite(self._limit):
            self._handle = loop.call_at(loop.time() + self._limit, self._check)
        return self

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
            self._expire()
            return
        # Early (bytes came since it was set), or busy: the earliest this wait could expire.
        due = (now if since is None else since) + self._limit
        self._handle = self._loop.call_at(due, self._check)
