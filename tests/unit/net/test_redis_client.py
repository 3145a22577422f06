"""open_redis's bound on connections, as each section's config sets it, and the calls' wait for
one of a Cluster's (nothing is connected)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import pytest
from aiohttp import web
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import BlockingConnectionPool
from redis.exceptions import MaxConnectionsError

from router.access.global_limits import GlobalLeases
from router.cache.tiers import open_cache
from router.config import CacheConfig, LimitsConfig, StateConfig
from router.net import redis_client
from router.net.redis_client import OUTAGE, Client, open_redis
from router.routing.affinity import ResponseHomes

# Nothing listens there: a client connects only when asked to run a command.
URL = "redis://127.0.0.1:1/0"


def bound(client: Client | None) -> tuple[str, int | None]:
    """How `client` bounds its connections: (how long a call waits for one, most at once)."""
    if isinstance(client, RedisCluster):
        calls = client.calls  # type: ignore[attr-defined]
        # Its nodes keep the bound too: none can have more connections than the client's calls.
        assert client.nodes_manager.connection_kwargs["max_connections"] == calls.bound
        return f"waits {calls.wait_s} s", calls.bound
    assert client is not None
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    return f"waits {pool.timeout} s", pool.max_connections


async def test_a_client_has_at_most_max_connections_and_waits_at_most_its_timeout() -> None:
    for cluster in (False, True):
        client = open_redis(URL, timeout_s=0.5, cluster=cluster)
        assert bound(client) == ("waits 0.5 s", 64)
        await client.aclose()
    client = open_redis(URL, timeout_s=0.5, max_connections=3, cluster=True)
    assert bound(client) == ("waits 0.5 s", 3)
    assert all(node.max_connections == 3 for node in client.nodes_manager.startup_nodes.values())
    await client.aclose()


async def test_each_section_s_bound_reaches_its_client() -> None:
    leases = GlobalLeases.from_config(
        LimitsConfig(backend="redis", redis_url=URL, redis_timeout_ms=300, redis_max_connections=3)
    )
    assert bound(leases._client) == ("waits 0.3 s", 3)
    await leases.close()

    cache = open_cache(
        CacheConfig(redis_url=URL, redis_timeout_s=0.4, redis_max_connections=5),
        lambda body, namespace, level: body,
    )
    assert cache.redis is not None
    assert bound(cache.redis._client) == ("waits 0.4 s", 5)
    await cache.close()

    homes = ResponseHomes(StateConfig(redis_url=URL, redis_max_connections=7))
    life = homes.lifetime(web.Application())
    await anext(life)
    assert bound(homes._redis) == ("waits 0.25 s", 7)
    await anext(life, None)


class Wire:
    """Fake calls for a client's `calls` (no socket): each marks its command sent (as a
    connection's write does), or not, then holds until let go."""

    def __init__(self) -> None:
        self.going = 0  # calls holding a slot now
        self.ran = 0
        self.go = asyncio.Event()

    async def call(self, send: bool = True) -> str:
        self.ran += 1
        self.going += 1
        try:
            if send:
                sent = redis_client._CALL.get()
                assert sent is not None
                sent.sent = True
            await self.go.wait()
            return "answer"
        finally:
            self.going -= 1


# The calls of one client, as a Cluster's (open_redis: `bound`, wait_s=its timeout) has them.
Calls = redis_client._Calls


async def until(done: Callable[[], bool]) -> None:
    """Until `done()` (the loop runs the tasks meanwhile); fails after a generous while."""
    for _ in range(10_000):
        if done():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never came to pass")


async def full_bound_goes_through(calls: Calls, bound: int) -> None:
    """Exactly `bound` calls at once get a slot (none kept by earlier calls, none given back
    twice); the next one waits for one of them to end."""
    wire = Wire()
    tasks = [asyncio.ensure_future(calls.run(wire.call)) for _ in range(bound + 1)]
    await until(lambda: wire.going == bound)
    await asyncio.sleep(0.05)  # a slot given back twice would let the last one in meanwhile
    assert (wire.going, wire.ran) == (bound, bound)
    wire.go.set()
    assert await asyncio.gather(*tasks) == ["answer"] * (bound + 1)


async def test_a_cluster_call_past_the_bound_waits_for_a_slot() -> None:
    calls = Calls(bound=2, wait_s=5.0)
    await full_bound_goes_through(calls, 2)
    await calls.aclose()


async def test_a_cluster_call_waits_for_a_slot_at_most_its_timeout() -> None:
    """Then it fails as an outage, without running: its coroutine is never made, so none is
    left unawaited."""
    calls = Calls(bound=1, wait_s=0.05)
    wire = Wire()
    holding = asyncio.ensure_future(calls.run(wire.call))
    await until(lambda: wire.going == 1)
    made: list[str] = []

    def make() -> Coroutine[Any, Any, str]:
        made.append("call")
        return wire.call()

    with pytest.raises(MaxConnectionsError) as refused:
        await calls.run(make)
    assert isinstance(refused.value, OUTAGE)
    # Never made (a pipeline's call wraps another coroutine: one made and closed unstarted
    # would leave that one never awaited).
    assert made == []
    assert wire.ran == 1
    wire.go.set()
    assert await holding == "answer"
    calls.wait_s = 5.0  # long enough for the next check's waiting call
    await full_bound_goes_through(calls, 1)
    await calls.aclose()


async def give_up(
    calls: Calls,
    call: Callable[[], Coroutine[Any, Any, str]],
    when: Callable[[], bool],
    pause_s: float = 0.0,
) -> None:
    """Run `call` and cancel its caller `pause_s` after it started and once `when()`."""
    task = asyncio.ensure_future(calls.run(call))
    await asyncio.sleep(pause_s)  # 0: cancelled as the call starts waiting
    await until(when)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cluster_callers_that_give_up_leak_no_slot() -> None:
    """A caller cancelled while its call waits for a slot, or after the call took one but
    before its command went out, leaves no slot taken; one cancelled once the command was sent
    leaves the call going with its slot (the connection is still in use) until it ends, then
    the slot comes back, once."""
    bound = 2
    calls = Calls(bound=bound, wait_s=5.0)
    holder = Wire()
    holding = [asyncio.ensure_future(calls.run(holder.call)) for _ in range(bound)]
    await until(lambda: holder.going == bound)
    waiting = Wire()
    for pause_s in (0.0, 0.01):  # as the call starts waiting for a slot; while it waits
        for _ in range(3):
            await give_up(calls, waiting.call, lambda: True, pause_s)
    holder.go.set()
    await asyncio.gather(*holding)
    assert waiting.ran == 0
    await full_bound_goes_through(calls, bound)

    unsent = Wire()
    for _ in range(5):  # holding a slot, nothing sent yet
        await give_up(calls, partial(unsent.call, send=False), lambda: unsent.going == 1)
        await until(lambda: unsent.going == 0)
    assert unsent.ran == 5
    await full_bound_goes_through(calls, bound)

    sent = Wire()
    await give_up(calls, sent.call, lambda: sent.going == 1)
    assert sent.going == 1  # the call goes on, holding its slot
    others = Wire()
    others_going = [asyncio.ensure_future(calls.run(others.call)) for _ in range(bound)]
    await until(lambda: others.going == bound - 1)
    await asyncio.sleep(0.05)
    assert others.going == bound - 1
    sent.go.set()
    await calls.settle()
    await until(lambda: others.going == bound)
    others.go.set()
    await asyncio.gather(*others_going)
    await full_bound_goes_through(calls, bound)
    await calls.aclose()
