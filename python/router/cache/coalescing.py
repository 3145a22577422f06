"""Request coalescing: concurrent identical misses share one upstream request, streams included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")


class FlightFailed(Exception):
    """The leader failed or was aborted; `sent` chunks had already reached this follower."""

    def __init__(self, sent: int, cause: BaseException | None) -> None:
        super().__init__(f"coalesced request failed after {sent} chunks: {cause!r}")
        self.sent = sent
        self.cause = cause


class _State(Enum):
    RUNNING = 1
    DONE = 2
    FAILED = 3


class Flight(Generic[T]):
    """One in-progress upstream request: its stream chunks so far and, at the end, its result."""

    __slots__ = (
        "_changed",
        "_error",
        "_result",
        "_state",
        "chunks",
        "detached",
        "followers",
        "key",
    )

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.chunks: list[bytes] = []
        # Followers reading it now (each `leave`s when its answer ends, however it ends).
        self.followers = 0
        # The exchange went on without its leader (its client left, followers still read):
        # whoever took it over finishes or fails the flight.
        self.detached = False
        self._state = _State.RUNNING
        self._result: T | None = None
        self._error: BaseException | None = None
        self._changed = asyncio.Event()

    @property
    def running(self) -> bool:
        """Neither finished nor failed yet."""
        return self._state is _State.RUNNING

    def leave(self) -> None:
        """Follower: done reading (answered, failed or its client left)."""
        self.followers -= 1

    def publish(self, chunk: bytes) -> None:
        """Leader: one more stream chunk for every follower, present and future."""
        if self._state is not _State.RUNNING:
            raise RuntimeError("publish on a finished flight")
        self.chunks.append(chunk)
        self._wake()

    def _settle(self, state: _State, result: T | None, error: BaseException | None) -> None:
        if self._state is _State.RUNNING:
            self._state, self._result, self._error = state, result, error
            self._wake()

    def _wake(self) -> None:
        # Waiters hold the old event; swapping before set() lets each wake exactly once per change.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def follow(self) -> AsyncIterator[bytes]:
        """Follower: the chunks published so far, then the rest live; raises FlightFailed."""
        sent = 0
        while True:
            changed = self._changed
            while sent < len(self.chunks):
                yield self.chunks[sent]
                sent += 1
            if self._state is _State.DONE:
                return
            if self._state is _State.FAILED:
                raise FlightFailed(sent, self._error)
            await changed.wait()

    async def result(self) -> T:
        """Follower: the leader's final result; raises FlightFailed."""
        while self._state is _State.RUNNING:
            await self._changed.wait()
        if self._state is _State.FAILED or self._result is None:
            raise FlightFailed(0, self._error)
        return self._result


class SingleFlight(Generic[T]):
    """Registry of running flights by key; the first caller for a key leads, the rest follow."""

    def __init__(self) -> None:
        self._flights: dict[Hashable, Flight[T]] = {}
        self.led = 0
        self.followed = 0

    def __len__(self) -> int:
        return len(self._flights)

    def join(self, key: Hashable) -> tuple[Flight[T], bool]:
        """The flight for `key` and whether the caller leads it (must then call `lead`)."""
        flight = self._flights.get(key)
        if flight is not None and flight.running:
            flight.followers += 1
            self.followed += 1
            return flight, False
        flight = Flight(key)
        self._flights[key] = flight
        self.led += 1
        return flight, True

    @contextmanager
    def lead(self, flight: Flight[T]) -> Iterator[Flight[T]]:
        """Leader's scope: leaving it without `finish` (error, cancel, abort) fails the flight,
        unless the exchange was detached from the leader and goes on for its followers."""
        try:
            yield flight
        except BaseException as exc:
            if not flight.detached:
                self._close(flight, _State.FAILED, None, exc)
            raise
        finally:
            if not flight.detached:
                self._close(flight, _State.FAILED, None, None)

    def finish(self, flight: Flight[T], result: T) -> None:
        """Leader: success; followers get `result` (and already have every chunk)."""
        self._close(flight, _State.DONE, result, None)

    def fail(self, flight: Flight[T], error: BaseException | None = None) -> None:
        """Leader: failure; followers are released with FlightFailed."""
        self._close(flight, _State.FAILED, None, error)

    def _close(
        self, flight: Flight[T], state: _State, result: T | None, error: BaseException | None
    ) -> None:
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
        flight._settle(state, result, error)
