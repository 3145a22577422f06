"""open_redis's bound on connections, as each section's config sets it (nothing is connected)."""

from __future__ import annotations

from aiohttp import web
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import BlockingConnectionPool

from router.access.global_limits import GlobalLeases
from router.cache.tiers import open_cache
from router.config import CacheConfig, LimitsConfig, StateConfig
from router.net.redis_client import Client, open_redis
from router.routing.affinity import ResponseHomes

# Nothing listens there: a client connects only when asked to run a command.
URL = "redis://127.0.0.1:1/0"


def bound(client: Client | None) -> tuple[str, int | None]:
    """How `client` bounds its connections: (kind, most per pool or per Cluster node)."""
    if isinstance(client, RedisCluster):
        return "per node", client.nodes_manager.connection_kwargs["max_connections"]
    assert client is not None
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    return f"waits {pool.timeout} s", pool.max_connections


async def test_a_client_has_at_most_max_connections_and_waits_at_most_its_timeout() -> None:
    for cluster, expected in ((False, ("waits 0.5 s", 64)), (True, ("per node", 64))):
        client = open_redis(URL, timeout_s=0.5, cluster=cluster)
        assert bound(client) == expected
        await client.aclose()
    client = open_redis(URL, timeout_s=0.5, max_connections=3, cluster=True)
    assert bound(client) == ("per node", 3)
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
