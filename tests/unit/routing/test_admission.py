"""Admission: slot accounting, priority order, bounded queue, spill and 503, no leaked slots."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.routing.admission import Admission, SlotQueue, Spill, Ticket


def test_slots_up_to_the_cap() -> None:
    q: SlotQueue[str] = SlotQueue(max_in_flight=2, capacity=4)
    assert q.try_acquire()
    assert q.try_acquire()
    assert not q.try_acquire()
    assert q.in_flight == 2


def test_release_without_waiters_frees_the_slot() -> None:
    q: SlotQueue[str] = SlotQueue(max_in_flight=1, capacity=4)
    assert q.try_acquire()
    assert q.release() is None
    assert q.in_flight == 0
    assert q.try_acquire()


def test_waiters_served_by_priority_then_arrival() -> None:
    q: SlotQueue[str] = SlotQueue(max_in_flight=1, capacity=8)
    assert q.try_acquire()
    for name, priority in [("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5), ("mid", 2)]:
        assert q.push(priority, name) is not None
    served = [q.release() for _ in range(5)]
    assert served == ["high1", "high2", "mid", "low1", "low2"]
    # Each release handed the slot on, so it stayed taken until the queue emptied.
    assert q.in_flight == 1
    assert q.release() is None
    assert q.in_flight == 0


def test_queue_is_bounded() -> None:
    q: SlotQueue[int] = SlotQueue(max_in_flight=1, capacity=2)
    assert q.try_acquire()
    assert q.push(0, 1) is not None
    assert q.push(0, 2) is not None
    assert q.push(9, 3) is None
    assert q.depth == 2


def test_no_slot_jumps_the_queue() -> None:
    q: SlotQueue[str] = SlotQueue(max_in_flight=1, capacity=2)
    assert q.try_acquire()
    q.push(0, "w")
    assert not q.try_acquire()


def test_cancelled_waiter_is_skipped_and_uncounted() -> None:
    q: SlotQueue[str] = SlotQueue(max_in_flight=1, capacity=4)
    assert q.try_acquire()
    gone = q.push(5, "gone")
    q.push(0, "stays")
    assert gone is not None
    assert q.cancel(gone)
    assert not q.cancel(gone)
    assert q.depth == 1
    assert q.release() == "stays"
    assert q.depth == 0


def test_waiters_giving_up_while_slots_stay_held_do_not_grow_the_queue() -> None:
    # Slots held by long streams, and a stream of newcomers that each give up (their queue
    # deadline): the withdrawn tickets are dropped, not kept until a slot frees.
    q: SlotQueue[int] = SlotQueue(max_in_flight=1, capacity=8)
    assert q.try_acquire()
    stays = q.push(0, -1)
    for i in range(10_000):
        ticket = q.push(i % 3, i)
        assert ticket is not None
        assert q.cancel(ticket)
    assert stays is not None
    assert q.depth == 1
    assert len(q._heap) <= 2 * 64 + 2
    assert q.ahead_of(0) == 1
    assert q.release() == -1
    assert q.release() is None
    assert (q.in_flight, q.depth) == (0, 0)


def test_cancel_after_being_served_reports_false() -> None:
    q: SlotQueue[str] = SlotQueue(max_in_flight=1, capacity=4)
    assert q.try_acquire()
    ticket = q.push(0, "w")
    assert ticket is not None
    assert q.release() == "w"
    assert not q.cancel(ticket)
    assert q.in_flight == 1


def test_expected_wait_counts_equal_or_higher_priority_ahead() -> None:
    q: SlotQueue[str] = SlotQueue(max_in_flight=2, capacity=8, initial_hold_s=1.0)
    q.try_acquire()
    q.try_acquire()
    q.push(5, "a")
    q.push(5, "b")
    q.push(0, "c")
    assert q.ahead_of(5) == 2
    assert q.ahead_of(0) == 3
    assert q.ahead_of(9) == 0
    assert q.expected_wait(9) == pytest.approx(0.5)
    assert q.expected_wait(0) == pytest.approx(2.0)


def test_hold_time_is_a_moving_average() -> None:
    q: SlotQueue[str] = SlotQueue(max_in_flight=1, capacity=1, initial_hold_s=1.0)
    q.try_acquire()
    q.release(held_s=2.0)
    assert 1.0 < q.hold_s < 2.0
    for _ in range(50):
        q.try_acquire()
        q.release(held_s=2.0)
    assert q.hold_s == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize(("cap", "size"), [(0, 1), (1, -1)])
def test_bad_sizes_are_refused(cap: int, size: int) -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        SlotQueue(max_in_flight=cap, capacity=size)


async def until(done: Callable[[], bool]) -> None:
    """Let other tasks run until `done()` holds (bounded, no sleeping)."""
    for _ in range(1000):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def _admission(cap: int = 1, queue: int = 4, wait: float = 5.0) -> Admission:
    return Admission(max_in_flight=cap, queue_size=queue, max_wait_s=wait)


async def test_per_region_caps_are_separate() -> None:
    adm = Admission(max_in_flight=1, queue_size=0, max_wait_s=1.0, region_max_in_flight={"b": 2})
    a1 = await adm.acquire("a")
    b1 = await adm.acquire("b")
    b2 = await adm.acquire("b")
    with pytest.raises(Spill):
        await adm.acquire("b")
    assert (adm.in_flight("a"), adm.in_flight("b")) == (1, 2)
    for slot in (a1, b1, b2):
        slot.release()
    assert (adm.in_flight("a"), adm.in_flight("b")) == (0, 0)


async def test_full_queue_spills_and_the_answer_when_no_region_took_it_is_503() -> None:
    adm = _admission(cap=1, queue=0)
    held = await adm.acquire("a")
    with pytest.raises(Spill) as spill:
        await adm.acquire("a")
    assert spill.value.region == "a"
    err = adm.unavailable("a", spill.value.reason)
    assert err.status == 503
    assert int(err.headers["Retry-After"]) >= 1
    assert json.loads(err.body())["error"]["code"] == "overloaded"
    held.release()


async def test_wait_past_the_deadline_spills_without_queueing() -> None:
    adm = _admission(cap=1, queue=4)
    held = await adm.acquire("a")
    adm.gate("a").queue.hold_s = 10.0
    with pytest.raises(Spill, match="deadline"):
        await adm.acquire("a", deadline=time.monotonic() + 0.5)
    assert adm.depth("a") == 0
    held.release()


async def test_queued_request_gets_the_released_slot_and_records_its_wait() -> None:
    adm = _admission(cap=1)
    held = await adm.acquire("a")
    waiter = asyncio.create_task(adm.acquire("a"))
    await until(lambda: adm.depth("a") == 1)
    held.release()
    slot = await waiter
    assert slot.queue_depth == 0
    assert slot.wait_s > 0
    assert adm.in_flight("a") == 1
    slot.release()
    slot.release()  # idempotent
    assert adm.in_flight("a") == 0


async def test_higher_priority_is_woken_first() -> None:
    adm = _admission(cap=1, queue=8)
    held = await adm.acquire("a")
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        slot = await adm.acquire("a", priority=priority)
        order.append(name)
        await asyncio.sleep(0)
        slot.release()

    tasks = [asyncio.create_task(wait(n, p)) for n, p in [("low", 0), ("high", 9), ("mid", 3)]]
    await until(lambda: adm.depth("a") == 3)
    held.release()
    await asyncio.gather(*tasks)
    assert order == ["high", "mid", "low"]
    assert adm.in_flight("a") == 0


async def test_deadline_passing_in_the_queue_spills_and_leaks_nothing() -> None:
    adm = _admission(cap=1)
    held = await adm.acquire("a")
    adm.gate("a").queue.hold_s = 0.001
    with pytest.raises(Spill, match="deadline passed"):
        await adm.acquire("a", deadline=time.monotonic() + 0.02)
    assert adm.depth("a") == 0
    held.release()
    assert adm.in_flight("a") == 0


async def test_cancelled_waiter_leaks_nothing() -> None:
    adm = _admission(cap=1)
    held = await adm.acquire("a")
    waiter = asyncio.create_task(adm.acquire("a"))
    await until(lambda: adm.depth("a") == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.depth("a") == 0
    held.release()
    assert adm.in_flight("a") == 0


async def test_cancelled_right_after_being_handed_the_slot_passes_it_on() -> None:
    adm = _admission(cap=1)
    held = await adm.acquire("a")
    first = asyncio.create_task(adm.acquire("a"))
    await until(lambda: adm.depth("a") == 1)
    second = asyncio.create_task(adm.acquire("a"))
    await until(lambda: adm.depth("a") == 2)
    held.release()  # hands the slot to `first`, which is cancelled before it runs
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    slot = await second
    assert adm.in_flight("a") == 1
    slot.release()
    assert adm.in_flight("a") == 0


@given(
    cap=st.integers(1, 4),
    capacity=st.integers(0, 4),
    ops=st.lists(st.tuples(st.sampled_from(["enter", "release", "cancel"]), st.integers(0, 3))),
)
def test_slots_are_never_over_the_cap_nor_lost(
    cap: int, capacity: int, ops: list[tuple[str, int]]
) -> None:
    q: SlotQueue[int] = SlotQueue(max_in_flight=cap, capacity=capacity)
    holders = 0  # requests holding a slot
    waiting: list[Ticket[int]] = []
    for op, arg in ops:
        if op == "enter":
            if q.try_acquire():
                holders += 1
            else:
                ticket = q.push(arg, arg)
                if ticket is not None:
                    waiting.append(ticket)
        elif op == "release" and holders:
            woken = q.release()
            if woken is None:
                holders -= 1
            else:
                waiting = [t for t in waiting if not t.cancelled]
        elif op == "cancel" and waiting:
            assert q.cancel(waiting.pop(arg % len(waiting)))
        assert q.in_flight == holders <= cap
        assert q.depth == len([t for t in waiting if not t.cancelled]) <= capacity
        # Nobody waits while a slot is free.
        assert q.depth == 0 or q.in_flight == cap
