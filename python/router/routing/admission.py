"""Per-region in-flight caps with a bounded, priority-ordered wait queue and spill-over."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from aiohttp import web

from router.core.failure import Spill
from router.errors import Unavailable

if TYPE_CHECKING:
    from router.config import AdmissionConfig

W = TypeVar("W")

# Weight of the newest sample in the moving average of how long a slot is held.
_HOLD_ALPHA = 0.2


@dataclass(order=True, slots=True)
class Ticket(Generic[W]):
    """A place in a wait queue; higher priority first, then first come first served."""

    rank: int
    seq: int
    waiter: W = field(compare=False)
    cancelled: bool = field(default=False, compare=False)  # withdrawn, or already served


class SlotQueue(Generic[W]):
    """Pure state of one region: slots in use and who waits for the next one."""

    def __init__(self, max_in_flight: int, capacity: int, initial_hold_s: float = 0.05) -> None:
        if max_in_flight < 1 or capacity < 0:
            raise ValueError("max_in_flight must be >= 1 and capacity >= 0")
        self.max_in_flight = max_in_flight
        self.capacity = capacity
        self.in_flight = 0
        self.hold_s = initial_hold_s
        self._heap: list[Ticket[W]] = []
        self._depth = 0
        self._seq = itertools.count()

    @property
    def depth(self) -> int:
        """Waiters still queued (cancelled ones excluded)."""
        return self._depth

    def try_acquire(self) -> bool:
        """Take a free slot unless one is free only for someone already waiting."""
        if self.in_flight < self.max_in_flight and self._depth == 0:
            self.in_flight += 1
            return True
        return False

    def ahead_of(self, priority: int) -> int:
        """How many queued waiters a newcomer with `priority` would wait behind."""
        return sum(1 for t in self._heap if not t.cancelled and -t.rank >= priority)

    def expected_wait(self, priority: int) -> float:
        """Estimated seconds until a newcomer with `priority` gets a slot."""
        return (self.ahead_of(priority) + 1) * self.hold_s / self.max_in_flight

    def push(self, priority: int, waiter: W) -> Ticket[W] | None:
        """Queue a waiter; None when the queue is full."""
        if self._depth >= self.capacity:
            return None
        ticket = Ticket(-priority, next(self._seq), waiter)
        heapq.heappush(self._heap, ticket)
        self._depth += 1
        return ticket

    def cancel(self, ticket: Ticket[W]) -> bool:
        """Withdraw a queued waiter; False if it already got its slot."""
        if ticket.cancelled:
            return False
        ticket.cancelled = True
        self._depth -= 1
        return True

    def release(self, held_s: float | None = None) -> W | None:
        """Free a slot: hand it to the best waiter (returned) or give it back."""
        if held_s is not None:
            self.hold_s += _HOLD_ALPHA * (held_s - self.hold_s)
        while self._heap:
            ticket = heapq.heappop(self._heap)
            if not ticket.cancelled:
                self._depth -= 1
                # The slot passes straight to the waiter: in_flight stays the same.
                ticket.cancelled = True
                return ticket.waiter
        self.in_flight -= 1
        return None


@dataclass(slots=True)
class Slot:
    """A held in-flight slot of one region; release it exactly once."""

    region: str
    wait_s: float
    queue_depth: int
    _gate: RegionGate | None
    _start: float

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.release(time.monotonic() - self._start)


class RegionGate:
    """The asyncio side of one region's SlotQueue."""

    def __init__(self, region: str, max_in_flight: int, queue_size: int) -> None:
        self.region = region
        self.queue: SlotQueue[asyncio.Future[None]] = SlotQueue(max_in_flight, queue_size)

    def release(self, held_s: float | None) -> None:
        """Free a slot, waking the best waiter."""
        # Waiters leave the queue (cancel) before their future is cancelled, so a popped
        # waiter is always still pending.
        waiter = self.queue.release(held_s)
        if waiter is not None:
            waiter.set_result(None)

    async def acquire(self, priority: int, deadline: float) -> Slot:
        """A slot now, or after a wait that ends by `deadline` (monotonic); else Spill."""
        start = time.monotonic()
        if self.queue.try_acquire():
            return Slot(self.region, 0.0, 0, self, start)
        depth = self.queue.depth
        if start + self.queue.expected_wait(priority) > deadline:
            raise Spill(self.region, "wait would pass the deadline")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ticket = self.queue.push(priority, future)
        if ticket is None:
            raise Spill(self.region, "queue full")
        try:
            # shield: only release() completes the future, so a cancel cannot race its set_result.
            async with asyncio.timeout(max(0.0, deadline - start)):
                await asyncio.shield(future)
        except TimeoutError:
            if not self.queue.cancel(ticket):
                # Woken in the same tick as the timeout: the slot is ours, use it.
                return Slot(self.region, time.monotonic() - start, depth, self, time.monotonic())
            future.cancel()
            raise Spill(self.region, "deadline passed while queued") from None
        except asyncio.CancelledError:
            if not self.queue.cancel(ticket):
                self.release(None)  # handed a slot while being cancelled: pass it on
            future.cancel()
            raise
        now = time.monotonic()
        return Slot(self.region, now - start, depth, self, now)


class Admission:
    """Every region's gate, created on first use with the configured caps."""

    def __init__(
        self,
        *,
        max_in_flight: int,
        queue_size: int,
        max_wait_s: float,
        region_max_in_flight: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.queue_size = queue_size
        self.max_wait_s = max_wait_s
        self._caps = dict(region_max_in_flight or {})
        self._gates: dict[str, RegionGate] = {}
        self._clock = clock

    @classmethod
    def from_config(cls, config: AdmissionConfig) -> Admission:
        """Build from the `[admission]` section."""
        return cls(
            max_in_flight=config.max_in_flight,
            queue_size=config.queue_size,
            max_wait_s=config.max_wait_s,
            region_max_in_flight=config.region_max_in_flight,
        )

    def gate(self, region: str) -> RegionGate:
        """The gate of `region`."""
        gate = self._gates.get(region)
        if gate is None:
            cap = self._caps.get(region, self.max_in_flight)
            gate = self._gates[region] = RegionGate(region, cap, self.queue_size)
        return gate

    def in_flight(self, region: str) -> int:
        """Slots of `region` in use now."""
        return self.gate(region).queue.in_flight

    def depth(self, region: str) -> int:
        """Requests queued for `region` now."""
        return self.gate(region).queue.depth

    async def acquire(
        self, region: str, *, priority: int = 0, deadline: float | None = None, last: bool = False
    ) -> Slot:
        """A slot of `region`; Spill to try the next region, or 503 when this is the `last`."""
        gate = self._gates.get(region)
        if gate is not None and gate.queue.try_acquire():
            # A free slot (the usual case): taken here, without the gate's wait machinery.
            return Slot(region, 0.0, 0, gate, time.monotonic())
        limit = self._clock() + self.max_wait_s
        deadline = limit if deadline is None else min(deadline, limit)
        try:
            return await self.gate(region).acquire(priority, deadline)
        except Spill as spill:
            if last:
                raise self.unavailable(region, spill.reason) from None
            raise

    def unavailable(self, region: str, reason: str) -> Unavailable:
        """The 503 when no region can take the request, with a Retry-After hint."""
        wait = self.gate(region).queue.expected_wait(0)
        retry_after = max(1, math.ceil(wait))
        return Unavailable(
            f"All regions are at capacity ({reason}); retry in {retry_after}s.",
            code="overloaded",
            headers={"Retry-After": str(retry_after)},
        )


ADMISSION: web.AppKey[Admission] = web.AppKey("router.admission", Admission)
