"""IdleWatch: one wait longer than the limit times out; busy time and many short waits do not.
Deadline: asyncio.timeout's rule for one fixed deadline, which lift() removes."""

from __future__ import annotations

import asyncio

import pytest

from router.net.idle import Deadline, IdleWatch

LIMIT = 0.05


async def wait_once(busy_first: float = 0.0) -> None:
    """Be busy for `busy_first` s, then wait for bytes that never come."""
    async with IdleWatch(LIMIT) as watch:
        await asyncio.sleep(busy_first)
        watch.waiting()
        await asyncio.sleep(10)


async def test_a_wait_longer_than_the_limit_times_out() -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(TimeoutError):
        await wait_once()
    # It fired at the wait's deadline, not at some later multiple of it.
    assert LIMIT <= loop.time() - began < 10 * LIMIT


async def test_short_waits_adding_up_past_the_limit_do_not() -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with IdleWatch(LIMIT) as watch:
        while loop.time() - began < 6 * LIMIT:
            watch.waiting()
            await asyncio.sleep(LIMIT / 5)
            watch.busy()


async def test_busy_time_is_not_idle_time() -> None:
    async with IdleWatch(LIMIT) as watch:
        watch.waiting()
        await asyncio.sleep(LIMIT / 5)
        watch.busy()
        await asyncio.sleep(4 * LIMIT)  # e.g. a write waiting for a slow client
        watch.waiting()
        await asyncio.sleep(LIMIT / 5)
        watch.busy()


async def test_a_wait_after_busy_time_gets_its_full_limit() -> None:
    # The timer set at entry fires while busy; the next wait still gets all of LIMIT.
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(TimeoutError):
        await wait_once(busy_first=1.5 * LIMIT)
    assert loop.time() - began >= 2.5 * LIMIT


@pytest.mark.parametrize("timer", [IdleWatch, Deadline])
async def test_an_outside_cancel_stays_a_cancel(timer: type[IdleWatch | Deadline]) -> None:
    async def wait() -> None:
        async with timer(10.0) as watch:
            if isinstance(watch, IdleWatch):
                watch.waiting()
            await asyncio.sleep(10)

    task = asyncio.create_task(wait())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_no_limit_never_times_out() -> None:
    async with IdleWatch(float("inf")) as watch:
        watch.waiting()
        await asyncio.sleep(LIMIT)


async def test_a_deadline_times_out_the_wait_it_covers() -> None:
    with pytest.raises(TimeoutError):
        async with Deadline(LIMIT):
            await asyncio.sleep(10)


async def test_a_lifted_deadline_never_fires() -> None:
    async with Deadline(LIMIT) as deadline:
        deadline.lift()
        await asyncio.sleep(3 * LIMIT)


async def test_other_errors_pass_a_deadline_unchanged() -> None:
    with pytest.raises(KeyError):
        async with Deadline(10.0):
            raise KeyError("x")


async def test_an_inner_deadline_is_the_one_that_fires() -> None:
    # Inside a longer asyncio.timeout the outer block sees no timeout of its own.
    async with asyncio.timeout(10.0):
        with pytest.raises(TimeoutError):
            async with Deadline(LIMIT):
                await asyncio.sleep(10)
        await asyncio.sleep(0)


async def test_no_deadline_never_fires() -> None:
    async with Deadline(float("inf")):
        await asyncio.sleep(LIMIT)


async def test_a_deadline_set_again_after_its_block_stops_nothing() -> None:
    # Past its block the timer holds no task (a task's error would hold it back: a cycle), and
    # a reset then must neither cancel the task it was in nor fail in the loop's callback.
    loop = asyncio.get_running_loop()
    failures: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: failures.append(context))
    try:
        async with Deadline(10.0, loop) as deadline:
            pass
        deadline.reset(0.001)
        await asyncio.sleep(0.02)
    finally:
        loop.set_exception_handler(None)
    assert failures == []
    task = asyncio.current_task()
    assert task is not None
    assert not task.cancelling()
