"""Single flight: one leader per key, followers get every chunk, failures release followers."""

from __future__ import annotations

import asyncio

import pytest

from router.cache.coalescing import Flight, FlightFailed, SingleFlight


async def collect(flight: Flight[str]) -> list[bytes]:
    return [c async for c in flight.follow()]


async def test_first_leads_rest_follow_and_finished_flight_is_forgotten() -> None:
    group: SingleFlight[str] = SingleFlight()
    leader, leads = group.join("k")
    follower, follows_leads = group.join("k")
    assert leads
    assert not follows_leads
    assert follower is leader
    assert len(group) == 1
    with group.lead(leader):
        group.finish(leader, "answer")
    assert len(group) == 0
    assert await follower.result() == "answer"
    _, leads_again = group.join("k")
    assert leads_again


async def test_distinct_keys_get_distinct_flights() -> None:
    group: SingleFlight[str] = SingleFlight()
    a, lead_a = group.join("a")
    b, lead_b = group.join("b")
    assert lead_a
    assert lead_b
    assert a is not b


async def test_late_joiner_gets_chunks_so_far_then_live() -> None:
    group: SingleFlight[str] = SingleFlight()
    flight, _ = group.join("k")
    early = asyncio.create_task(collect(flight))
    with group.lead(flight):
        flight.publish(b"1")
        flight.publish(b"2")
        await asyncio.sleep(0)
        late_flight, leads = group.join("k")
        assert not leads
        late = asyncio.create_task(collect(late_flight))
        await asyncio.sleep(0)
        flight.publish(b"3")
        await asyncio.sleep(0)
        group.finish(flight, "done")
    assert await early == [b"1", b"2", b"3"]
    assert await late == [b"1", b"2", b"3"]


async def test_leader_exception_releases_followers_with_count_sent() -> None:
    group: SingleFlight[str] = SingleFlight()
    flight, _ = group.join("k")
    got: list[bytes] = []

    async def follow() -> None:
        async for c in flight.follow():
            got.append(c)

    task = asyncio.create_task(follow())
    waiter = asyncio.create_task(flight.result())

    async def lead() -> None:
        with group.lead(flight):
            flight.publish(b"1")
            await asyncio.sleep(0)
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await lead()
    with pytest.raises(FlightFailed) as info:
        await task
    assert info.value.sent == 1
    assert isinstance(info.value.cause, ValueError)
    assert got == [b"1"]
    with pytest.raises(FlightFailed):
        await waiter
    assert len(group) == 0


async def test_leaving_lead_without_finish_fails_the_flight() -> None:
    group: SingleFlight[str] = SingleFlight()
    flight, _ = group.join("k")
    with group.lead(flight):
        pass
    with pytest.raises(FlightFailed):
        await flight.result()


async def test_cancelled_leader_never_leaves_followers_hanging() -> None:
    group: SingleFlight[str] = SingleFlight()
    flight, _ = group.join("k")
    started = asyncio.Event()

    async def lead() -> None:
        with group.lead(flight):
            flight.publish(b"x")
            started.set()
            await asyncio.sleep(3600)

    leader = asyncio.create_task(lead())
    await started.wait()
    follower = asyncio.create_task(collect(flight))
    await asyncio.sleep(0)
    leader.cancel()
    with pytest.raises(FlightFailed) as info:
        await follower
    assert isinstance(info.value.cause, asyncio.CancelledError)


async def test_many_followers_one_leader() -> None:
    group: SingleFlight[str] = SingleFlight()
    flights = [group.join("k") for _ in range(50)]
    assert sum(leads for _, leads in flights) == 1
    leader = flights[0][0]
    results = [asyncio.create_task(f.result()) for f, leads in flights if not leads]
    with group.lead(leader):
        group.finish(leader, "v")
    assert await asyncio.gather(*results) == ["v"] * 49
    assert group.led == 1
    assert group.followed == 49


async def test_publish_after_finish_is_refused() -> None:
    group: SingleFlight[str] = SingleFlight()
    flight, _ = group.join("k")
    group.finish(flight, "v")
    with pytest.raises(RuntimeError):
        flight.publish(b"late")
