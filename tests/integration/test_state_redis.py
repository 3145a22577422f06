"""[state] notes shared through a real redis-server: what another router wrote, or did not."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from router.config import StateConfig
from router.errors import StateNotFound, Unavailable
from router.routing.affinity import ResponseHomes
from tests.support import Proc, redis_clients

pytestmark = pytest.mark.redis


@pytest.fixture
async def homes(redis_proc: Proc) -> AsyncIterator[ResponseHomes]:
    h = ResponseHomes(StateConfig(redis_url=f"redis://127.0.0.1:{redis_proc.port}/0"))
    life = h.lifetime(web.Application())
    await anext(life)
    yield h
    with pytest.raises(StopAsyncIteration):
        await anext(life)


async def test_a_note_from_another_router_is_found(homes: ResponseHomes) -> None:
    assert homes._redis is not None
    await homes._redis.set(homes._key("resp_1"), "region-b\ntenant")
    assert await homes.home("resp_1", "tenant") == "region-b"


async def test_a_note_that_is_not_utf8_is_not_known(homes: ResponseHomes) -> None:
    # Was a UnicodeDecodeError: a 500 on the follow-up and on GET /v1/responses/{id}.
    assert homes._redis is not None
    await homes._redis.set(homes._key("resp_bad"), b"\xff\xfe\x00garbage")
    assert await homes.home("resp_bad", "tenant") is None


async def test_a_request_s_ids_are_read_in_one_round_trip(homes: ResponseHomes) -> None:
    assert homes._redis is not None
    await homes._redis.set(homes._key("item_b"), "region-b\ntenant")
    await homes._redis.set(homes._key("item_c"), "region-c\ntenant")
    before = (await homes._redis.info("stats"))["total_commands_processed"]
    found = await homes.homes(("item_b", "item_x", "item_c"), "tenant")
    after = (await homes._redis.info("stats"))["total_commands_processed"]
    assert found == ["region-b", None, "region-c"]
    assert after - before == 3 + 1  # three GETs (one pipeline) and the first INFO
    # Another tenant's among them: not found, whichever it is.
    with pytest.raises(StateNotFound) as foreign:
        await homes.homes(("item_x", "item_c"), "other")
    assert foreign.value.ref == "item_c"


async def test_no_answer_from_redis_is_a_503_never_not_known(
    homes: ResponseHomes, redis_proc: Proc
) -> None:
    """Issue: a lookup Redis did not answer (stopped, or farther than redis_timeout_s) was
    "not known", so a request continuing another tenant's response was routed as usual and
    answered by the region holding it."""
    assert homes._redis is not None
    await homes._redis.set(homes._key("resp_b"), "region-b\nowner")
    redis_proc.popen.send_signal(signal.SIGSTOP)
    try:
        for ids in (("resp_b",), ("resp_b", "item_y")):
            with pytest.raises(Unavailable) as down:
                await homes.homes(ids, "intruder")
            assert (down.value.status, down.value.code) == (503, "state_unavailable")
            assert down.value.headers["Retry-After"] == "1"
    finally:
        redis_proc.popen.send_signal(signal.SIGCONT)
    with pytest.raises(StateNotFound):
        await homes.home("resp_b", "intruder")


async def test_a_stalled_redis_is_a_503_on_a_bounded_number_of_connections(
    redis_proc: Proc,
) -> None:
    """Issue: every lookup made while Redis was stalled opened one more connection (the pool
    was unbounded). Now the lookups beyond `redis_max_connections` wait for one and are the
    same 503 at redis_timeout_s, never "not known"; afterwards lookups are answered again."""
    config = StateConfig(
        redis_url=f"redis://127.0.0.1:{redis_proc.port}/0",
        redis_timeout_s=0.3,
        redis_max_connections=2,
    )
    homes = ResponseHomes(config)
    life = homes.lifetime(web.Application())
    await anext(life)
    try:
        assert homes._redis is not None
        await homes._redis.set(homes._key("resp_b"), "region-b\nowner")
        _, accepted = redis_clients(redis_proc.port)
        redis_proc.popen.send_signal(signal.SIGSTOP)
        try:
            lookups = (homes.homes(("resp_b",), "intruder") for _ in range(20))
            failed = await asyncio.gather(*lookups, return_exceptions=True)
        finally:
            redis_proc.popen.send_signal(signal.SIGCONT)
        assert all(isinstance(exc, Unavailable) for exc in failed), failed
        assert {(exc.status, exc.code) for exc in failed} == {(503, "state_unavailable")}
        lookups = (homes.homes(("resp_b",), "intruder") for _ in range(20))
        found = await asyncio.gather(*lookups, return_exceptions=True)
        assert all(isinstance(exc, StateNotFound) for exc in found), found
        assert await homes.home("resp_b", "owner") == "region-b"
        open_now, now_accepted = redis_clients(redis_proc.port)
        assert open_now <= 2
        # Each of the two may have been closed by its socket timeout and opened once more.
        assert now_accepted - (accepted + 1) <= 2 * 2
    finally:
        with pytest.raises(StopAsyncIteration):
            await anext(life)
