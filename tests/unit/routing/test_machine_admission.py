"""Admission caps for a machine: two workers' Admissions over one shared table (in one process
here) never hold more than the cap together, serve each other's freed slots, and get back what
a dead worker held."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.access.shared_buckets import SharedBucketTable, create, forget_worker
from router.core.failure import Spill
from router.routing.admission import Admission, MachineGate


@pytest.fixture
def path(tmp_path: Path) -> str:
    file = str(tmp_path / "limits.table")
    create(file)
    return file


@pytest.fixture
def tables(path: str) -> Iterator[tuple[SharedBucketTable, SharedBucketTable]]:
    a, b = SharedBucketTable(path, 0), SharedBucketTable(path, 1)
    yield a, b
    a.close()
    b.close()


def _pair(
    tables: tuple[SharedBucketTable, SharedBucketTable], cap: int = 2, queue: int = 4
) -> tuple[Admission, Admission]:
    return tuple(  # type: ignore[return-value]
        Admission(max_in_flight=cap, queue_size=queue, max_wait_s=5.0, machine=t) for t in tables
    )


def _machine(adm: Admission, region: str = "r") -> MachineGate:
    gate = adm.gate(region)
    assert isinstance(gate, MachineGate)
    return gate


async def test_the_cap_holds_for_both_workers_together(
    tables: tuple[SharedBucketTable, SharedBucketTable],
) -> None:
    a, b = _pair(tables, cap=3)
    held = [await a.acquire("r"), await b.acquire("r"), await a.acquire("r")]
    # The machine is full: a fourth waits on either worker, and with no time to wait spills.
    for adm in (a, b):
        with pytest.raises(Spill):
            await adm.acquire("r", deadline=0.0)
    assert _machine(a).machine_in_flight() == 3
    # Each worker's own share (what its metrics report, summed across workers).
    assert (a.in_flight("r"), b.in_flight("r")) == (2, 1)
    assert (a.machine_in_flight("r"), b.machine_in_flight("r")) == (3, 3)
    for slot in held:
        slot.release()
    assert _machine(b).machine_in_flight() == 0


async def test_a_slot_freed_on_one_worker_serves_a_waiter_on_the_other(
    tables: tuple[SharedBucketTable, SharedBucketTable],
) -> None:
    a, b = _pair(tables, cap=1)
    first = await a.acquire("r")
    waiting = asyncio.create_task(b.acquire("r"))
    await asyncio.sleep(0)  # the task runs up to its wait
    assert _machine(b).machine_depth() == 1
    first.release()
    slot = await waiting  # found by b's poll within MACHINE_POLL_S
    assert slot.queue_depth == 0
    assert (a.in_flight("r"), b.in_flight("r"), _machine(a).machine_in_flight()) == (0, 1, 1)
    assert _machine(a).machine_depth() == 0
    slot.release()
    assert _machine(a).machine_in_flight() == 0


async def test_the_queue_is_the_machines(
    tables: tuple[SharedBucketTable, SharedBucketTable],
) -> None:
    a, b = _pair(tables, cap=1, queue=2)
    held = await a.acquire("r")
    waiters = [asyncio.create_task(adm.acquire("r")) for adm in (a, b)]
    await asyncio.sleep(0)
    assert _machine(a).machine_depth() == 2
    with pytest.raises(Spill, match="queue full"):
        await b.acquire("r")
    # A waiter that gives up frees its place in the machine's queue.
    waiters[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiters[1]
    assert _machine(a).machine_depth() == 1
    held.release()
    (await waiters[0]).release()
    assert (_machine(a).machine_in_flight(), _machine(a).machine_depth()) == (0, 0)


async def test_a_dead_workers_slots_come_back(
    path: str, tables: tuple[SharedBucketTable, SharedBucketTable]
) -> None:
    a, b = _pair(tables, cap=2)
    # Worker 0 holds both slots, then dies without releasing them.
    _lost = [await a.acquire("r"), await a.acquire("r")]
    with pytest.raises(Spill):
        await b.acquire("r", deadline=0.0)
    forget_worker(path, 0)  # what the supervisor does when it sees the exit
    slots = [await b.acquire("r"), await b.acquire("r")]
    assert _machine(b).machine_in_flight() == 2
    for slot in slots:
        slot.release()
