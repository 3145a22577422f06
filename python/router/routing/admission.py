"""Per-region in-flight caps with a bounded, priority-ordered wait queue and spill-over.

With `router serve --workers N` the caps are the machine's: slots and queue places are counted
in the table the workers share (access.shared_buckets, one count per worker, cleared when a
worker dies), and a worker's waiters take slots freed anywhere on the machine (MachineGate).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from aiohttp import web

from router.core.failure import Spill
from router.errors import Unavailable

if TYPE_CHECKING:
    from router.config import AdmissionConfig

W = TypeVar("W")

# Weight of the newest sample in the moving average of how long a slot is held.
_HOLD_ALPHA = 0.2
# Withdrawn tickets a queue keeps before it may drop them (see SlotQueue._stale).
_COMPACT_AFTER = 64
# How often a worker whose requests wait for a region looks for a slot another worker freed
# (one it frees itself goes to its best waiter at once).
MACHINE_POLL_S = 0.005


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
        # Withdrawn tickets still in the heap: dropped in one pass when they outnumber the
        # queued ones, so waiters that keep giving up while slots stay held (long streams)
        # cannot grow the heap, and each newcomer's count, without bound.
        self._stale = 0
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
        self._stale += 1
        if self._stale > _COMPACT_AFTER and self._stale > self._depth:
            self._heap = [t for t in self._heap if not t.cancelled]
            heapq.heapify(self._heap)
            self._stale = 0
        return True

    def held(self, held_s: float) -> None:
        """Learn how long a slot was held (the wait estimate)."""
        self.hold_s += _HOLD_ALPHA * (held_s - self.hold_s)

    def pop(self) -> W | None:
        """The best waiter, served from now on; None if nobody waits."""
        while self._heap:
            ticket = heapq.heappop(self._heap)
            if not ticket.cancelled:
                self._depth -= 1
                ticket.cancelled = True
                return ticket.waiter
            self._stale -= 1
        return None

    def release(self, held_s: float | None = None) -> W | None:
        """Free a slot: hand it to the best waiter (returned) or give it back."""
        if held_s is not None:
            self.held(held_s)
        waiter = self.pop()
        if waiter is None:
            self.in_flight -= 1
        # Otherwise the slot passes straight to the waiter: in_flight stays the same.
        return waiter


@dataclass(slots=True)
class Slot:
    """A held in-flight slot of one region; release it exactly once."""

    region: str
    wait_s: float
    queue_depth: int
    _gate: Gate | None
    _start: float

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.release(time.monotonic() - self._start)


class Gate:
    """What a region's gates share: a free slot taken at once, else a place in the wait queue
    held until a slot is handed over, the deadline passes (Spill) or the waiter is cancelled."""

    region: str
    # This worker's waiters; queue.in_flight counts this worker's slots.
    queue: SlotQueue[asyncio.Future[None]]

    def expected_wait(self, priority: int) -> float:
        """Estimated seconds until a newcomer with `priority` gets a slot."""
        raise NotImplementedError

    def release(self, held_s: float | None) -> None:
        """Free a slot, waking the best waiter."""
        raise NotImplementedError

    def _take_free(self) -> bool:
        """Take a slot that is free for a newcomer."""
        raise NotImplementedError

    def _depth(self) -> int:
        """Waiters a newcomer finds (the slot's queue_depth)."""
        raise NotImplementedError

    def _hold_place(self) -> bool:
        """Reserve a queue place beyond this worker's queue; False when none is left."""
        return True

    def _leave_place(self) -> None:
        """Give back the place _hold_place reserved."""

    def _enqueued(self) -> None:
        """A waiter was just queued."""

    async def acquire(self, priority: int, deadline: float) -> Slot:
        """A slot now, or after a wait that ends by `deadline` (monotonic); else Spill."""
        start = time.monotonic()
        if self._take_free():
            return Slot(self.region, 0.0, 0, self, start)
        depth = self._depth()
        if start + self.expected_wait(priority) > deadline:
            raise Spill(self.region, "wait would pass the deadline")
        if not self._hold_place():
            raise Spill(self.region, "queue full")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ticket = self.queue.push(priority, future)
        if ticket is None:
            self._leave_place()
            raise Spill(self.region, "queue full")
        self._enqueued()
        try:
            # shield: only release() completes the future, so a cancel cannot race its set_result.
            async with asyncio.timeout(max(0.0, deadline - start)):
                await asyncio.shield(future)
        except TimeoutError:
            if not self.queue.cancel(ticket):
                # Woken in the same tick as the timeout: the slot is ours, use it.
                return Slot(self.region, time.monotonic() - start, depth, self, time.monotonic())
            self._leave_place()
            future.cancel()
            raise Spill(self.region, "deadline passed while queued") from None
        except asyncio.CancelledError:
            if not self.queue.cancel(ticket):
                self.release(None)  # handed a slot while being cancelled: give it back
            else:
                self._leave_place()
            future.cancel()
            raise
        now = time.monotonic()
        return Slot(self.region, now - start, depth, self, now)


class RegionGate(Gate):
    """The asyncio side of one region's SlotQueue."""

    def __init__(self, region: str, max_in_flight: int, queue_size: int) -> None:
        self.region = region
        self.queue = SlotQueue(max_in_flight, queue_size)

    def expected_wait(self, priority: int) -> float:
        """Estimated seconds until a newcomer with `priority` gets a slot."""
        return self.queue.expected_wait(priority)

    def release(self, held_s: float | None) -> None:
        """Free a slot, waking the best waiter (the slot passes to it)."""
        # Waiters leave the queue (cancel) before their future is cancelled, so a popped
        # waiter is always still pending.
        waiter = self.queue.release(held_s)
        if waiter is not None:
            waiter.set_result(None)

    def _take_free(self) -> bool:
        return self.queue.try_acquire()

    def _depth(self) -> int:
        return self.queue.depth


class MachineCounts(Protocol):
    """Counts the workers of one machine share, one column per worker
    (access.shared_buckets.SharedBucketTable)."""

    def enter(self, key: str, limit: int) -> bool:
        """One more on this worker, unless the machine already has `limit`."""
        ...

    def leave(self, key: str) -> None:
        """One fewer on this worker."""
        ...

    def peek(self, key: str) -> int:
        """The machine's count, read without the lock (a hint)."""
        ...


class MachineGate(Gate):
    """A region's gate whose cap and queue are the machine's. A slot is taken from the shared
    count; a waiter waits in this worker's priority queue (holding a place in the machine's),
    and is served when a slot frees: one this worker frees goes to its best waiter at once,
    one another worker frees is found within MACHINE_POLL_S. Priority orders waiters within a
    worker; across workers a freed slot goes to whichever asks first."""

    def __init__(
        self,
        region: str,
        max_in_flight: int,
        queue_size: int,
        counts: MachineCounts,
        poll_s: float = MACHINE_POLL_S,
    ) -> None:
        self.region = region
        self.queue = SlotQueue(max_in_flight, queue_size)
        self._counts = counts
        self._slots = f"\x00admission:{region}"
        self._queued = f"\x00queue:{region}"
        self._poll_s = poll_s
        self._poller: asyncio.Task[None] | None = None

    def machine_in_flight(self) -> int:
        """Slots of the region in use on the whole machine."""
        return self._counts.peek(self._slots)

    def machine_depth(self) -> int:
        """Requests waiting for the region on the whole machine."""
        return self._counts.peek(self._queued)

    def expected_wait(self, priority: int) -> float:
        """Estimated seconds until a newcomer with `priority` gets a slot (waiters on other
        workers all count as ahead of it)."""
        elsewhere = max(0, self.machine_depth() - self.queue.depth)
        ahead = self.queue.ahead_of(priority) + elsewhere
        return (ahead + 1) * self.queue.hold_s / self.queue.max_in_flight

    def _take(self) -> bool:
        if self._counts.enter(self._slots, self.queue.max_in_flight):
            self.queue.in_flight += 1
            return True
        return False

    def _serve(self) -> None:
        """Free machine slots to this worker's best waiters."""
        while self.queue.depth and self._take():
            waiter = self.queue.pop()
            assert waiter is not None  # depth > 0
            self._counts.leave(self._queued)
            waiter.set_result(None)

    async def _poll(self) -> None:
        while self.queue.depth:
            await asyncio.sleep(self._poll_s)
            self._serve()

    def release(self, held_s: float | None) -> None:
        """Give the slot back to the machine, then serve this worker's waiters."""
        if held_s is not None:
            self.queue.held(held_s)
        # Back to the machine first: a slot passed from waiter to waiter here would starve
        # the waiters of other workers.
        self.queue.in_flight -= 1
        self._counts.leave(self._slots)
        self._serve()

    def _take_free(self) -> bool:
        # A free slot is the newcomer's only while nobody on the machine waits for one.
        return self.queue.depth == 0 and self.machine_depth() == 0 and self._take()

    def _depth(self) -> int:
        return self.machine_depth()

    def _hold_place(self) -> bool:
        return self._counts.enter(self._queued, self.queue.capacity)

    def _leave_place(self) -> None:
        self._counts.leave(self._queued)

    def _enqueued(self) -> None:
        # A slot may have freed between the check for one and the queueing.
        self._serve()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name=f"router.admission.{self.region}")


class Admission:
    """Every region's gate, created on first use with the configured caps; with `machine`,
    the caps hold for the workers of the machine together (MachineGate)."""

    def __init__(
        self,
        *,
        max_in_flight: int,
        queue_size: int,
        max_wait_s: float,
        region_max_in_flight: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        machine: MachineCounts | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.queue_size = queue_size
        self.max_wait_s = max_wait_s
        self._caps = dict(region_max_in_flight or {})
        self._gates: dict[str, RegionGate | MachineGate] = {}
        self._clock = clock
        self._machine = machine

    @classmethod
    def from_config(
        cls, config: AdmissionConfig, machine: MachineCounts | None = None
    ) -> Admission:
        """Build from the `[admission]` section; `machine`: the counts the workers share."""
        return cls(
            max_in_flight=config.max_in_flight,
            queue_size=config.queue_size,
            max_wait_s=config.max_wait_s,
            region_max_in_flight=config.region_max_in_flight,
            machine=machine,
        )

    def gate(self, region: str) -> RegionGate | MachineGate:
        """The gate of `region`."""
        gate = self._gates.get(region)
        if gate is None:
            cap = self._caps.get(region, self.max_in_flight)
            if self._machine is not None:
                gate = MachineGate(region, cap, self.queue_size, self._machine)
            else:
                gate = RegionGate(region, cap, self.queue_size)
            self._gates[region] = gate
        return gate

    def in_flight(self, region: str) -> int:
        """Slots of `region` in use now by this process (workers' shares add up)."""
        return self.gate(region).queue.in_flight

    def depth(self, region: str) -> int:
        """Requests queued for `region` now in this process (workers' shares add up)."""
        return self.gate(region).queue.depth

    def machine_in_flight(self, region: str) -> int:
        """Slots of `region` in use now on the whole machine (selection's load signal)."""
        gate = self.gate(region)
        if isinstance(gate, MachineGate):
            return gate.machine_in_flight()
        return gate.queue.in_flight

    async def acquire(
        self, region: str, *, priority: int = 0, deadline: float | None = None
    ) -> Slot:
        """A slot of `region`, or Spill: the next region may take it (the attempt path answers
        `unavailable` when none did)."""
        gate = self._gates.get(region)
        if type(gate) is RegionGate and gate.queue.try_acquire():
            # A free slot (the usual case): taken here, without the gate's wait machinery
            # (not for a machine's gate: its slots are counted with the other workers').
            return Slot(region, 0.0, 0, gate, time.monotonic())
        limit = self._clock() + self.max_wait_s
        deadline = limit if deadline is None else min(deadline, limit)
        return await self.gate(region).acquire(priority, deadline)

    def unavailable(self, region: str, reason: str) -> Unavailable:
        """The 503 when no region can take the request, with a Retry-After hint."""
        wait = self.gate(region).expected_wait(0)
        retry_after = max(1, math.ceil(wait))
        return Unavailable(
            f"All regions are at capacity ({reason}); retry in {retry_after}s.",
            code="overloaded",
            headers={"Retry-After": str(retry_after)},
        )


ADMISSION: web.AppKey[Admission] = web.AppKey("router.admission", Admission)
