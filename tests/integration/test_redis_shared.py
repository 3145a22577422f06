"""The shared state (leased global limits, cache tier 2) on a real Redis Cluster, including a
master killed and its replica promoted, and on a TLS Redis with a password."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from router.access.global_limits import UNLIMITED, GlobalLeases, Rates
from router.access.leasing import LeasePolicy, max_slice
from router.cache.policy import Entry
from router.cache.redis_tier import RedisTier
from router.net.redis_client import hash_tagged
from tests.integration.conftest import region_toml, start_router, start_sim
from tests.support import (
    Proc,
    RedisClusterProcs,
    self_signed,
    start_redis,
    start_redis_cluster,
)

pytestmark = pytest.mark.redis

RATES = Rates(request_capacity=20, requests_per_s=1e-6, token_capacity=UNLIMITED, tokens_per_s=1)
KEYS = [f"tenant-{i}" for i in range(6)]


def entry(body: bytes) -> Entry:
    now = time.time()
    return Entry(
        namespace="t",
        model="m",
        content_type="application/json",
        created=now,
        expires=now + 60,
        body=body,
    )


async def _drive(pops: list[GlobalLeases], keys: list[str], rounds: int) -> dict[str, int]:
    """Ask every instance for every key each round; admitted per key."""
    admitted = dict.fromkeys(keys, 0)
    for _ in range(rounds):
        for pop in pops:
            for key in keys:
                verdict = pop.take(key, RATES, 0)
                if verdict is not None:
                    admitted[key] += verdict[0]
        await asyncio.sleep(0.01)
    return admitted


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    """One cluster for the tests that do not break it."""
    procs = start_redis_cluster(tmp_path_factory.mktemp("cluster"))
    yield procs
    procs.kill()


async def test_leases_over_a_cluster_admit_each_key_exactly(cluster: RedisClusterProcs) -> None:
    redis_cluster = cluster
    # Keys on every master: each lease call is one key (one hash tag, one slot).
    owners = {redis_cluster.master_of(hash_tagged("router:rl:", k)).port for k in KEYS}
    assert len(owners) > 1
    pops = [
        GlobalLeases(redis_cluster.url, cluster=True, interval_s=0.02, timeout_s=2.0)
        for _ in range(3)
    ]
    try:
        admitted = await _drive(pops, KEYS, 40)
    finally:
        for pop in pops:
            await pop.close()
    low = 20 - 3 * max_slice(LeasePolicy(), 20)
    assert all(low <= n <= 20 for n in admitted.values()), admitted
    assert all(pop.outages == 0 for pop in pops)


async def test_cache_tier_over_a_cluster(cluster: RedisClusterProcs) -> None:
    redis_cluster = cluster
    tier = RedisTier(redis_cluster.url, cluster=True, timeout_s=2.0)
    other = RedisTier(redis_cluster.url, cluster=True, timeout_s=2.0)
    try:
        for i in range(20):
            assert await tier.put(b"k%d" % i, entry(b'{"n": %d}' % i))
        got = await other.get(b"k7", "t", "m")
        assert got is not None
        assert got.body == b'{"n": 7}'
        # Purge scans every master.
        assert await other.purge(namespace="t") == 20
        assert await tier.get(b"k7", "t", "m") is None
        assert tier.errors == other.errors == 0
    finally:
        await tier.close()
        await other.close()


async def _until(check: object, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.05)


def _promoted(cluster: RedisClusterProcs, key: str, victim: Proc) -> bool:
    try:
        return cluster.master_of(key) is not victim
    except LookupError:  # failed, not yet replaced
        return False


async def test_master_killed_and_replica_promoted(redis_cluster: RedisClusterProcs) -> None:
    leases = GlobalLeases(redis_cluster.url, cluster=True, interval_s=0.02, retry_s=0.2)
    tier = RedisTier(redis_cluster.url, cluster=True, timeout_s=0.5, retry_after_s=0.2)
    key = KEYS[0]
    rates = Rates(
        request_capacity=1000, requests_per_s=100, token_capacity=UNLIMITED, tokens_per_s=1
    )
    try:
        assert leases.take(key, rates, 0) is not None
        await _until(lambda: leases.leases[key].leased)
        assert await tier.put(b"before", entry(b"{}"))
        victim = redis_cluster.master_of(leases.key(key))
        victim.kill(signal.SIGKILL)
        # Requests never wait and never fail meanwhile: the slice, then local limits.
        while not _promoted(redis_cluster, leases.key(key), victim):
            leases.take(key, rates, 0)
            await asyncio.sleep(0.05)
        redis_cluster.wait_ok()
        syncs = leases.syncs

        def resumed() -> bool:
            leases.take(key, rates, 0)
            lease = leases.leases.get(key)
            return leases.available and leases.syncs > syncs and lease is not None and lease.leased

        await _until(resumed)
        # One outage, logged once: the probe pings every master, not just any node.
        assert leases.outages == 1

        # The promoted replica has the bucket (replicated) and answers the cache too.
        async def cached() -> bool:
            return (
                await tier.put(b"after", entry(b"{}"))
                and await tier.get(b"after", "t", "m") is not None
            )

        deadline = time.monotonic() + 30
        while not await cached():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
    finally:
        await leases.close()
        await tier.close()


async def test_router_over_a_cluster_limits_and_caches(
    cluster: RedisClusterProcs, tmp_path: Path
) -> None:
    redis_cluster = cluster
    sim = start_sim(tmp_path, "a")
    router: Proc | None = None
    url = redis_cluster.url
    try:
        text = (
            "[auth]\nenabled = false\n"
            f'[limits]\nbackend = "redis"\nredis_cluster = true\nredis_url = "{url}"\n'
            f'[cache]\nenabled = true\nredis_cluster = true\nredis_url = "{url}"\n'
            "cache_unset_temperature = true\nmax_temperature = 2.0\n" + region_toml(sim)
        )
        router = start_router(tmp_path, text)
        body = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(router.url + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
        assert "unreachable" not in router.output()
        assert "unavailable" not in router.output()
    finally:
        if router is not None:
            router.kill()
        sim.kill()


async def test_tls_and_password(tmp_path: Path) -> None:
    tls = self_signed(tmp_path)
    redis = start_redis(tmp_path, tls=tls, password="s3cret")
    url = f"rediss://:s3cret@127.0.0.1:{redis.port}/0?ssl_ca_certs={tls.cert}"
    wrong = f"rediss://:nope@127.0.0.1:{redis.port}/0?ssl_ca_certs={tls.cert}"
    plain = f"redis://:s3cret@127.0.0.1:{redis.port}/0"
    try:
        leases = GlobalLeases(url, interval_s=0.02)
        tier = RedisTier(url, timeout_s=2.0)
        try:
            admitted = (await _drive([leases], ["k"], 40))["k"]
            assert admitted == 20
            assert leases.outages == 0
            assert await tier.put(b"k", entry(b"{}"))
            assert await tier.get(b"k", "t", "m") is not None
        finally:
            await leases.close()
            await tier.close()
        # A wrong password or no TLS is an outage (local limits, no cache), never an exception.
        for bad in (wrong, plain):
            leases = GlobalLeases(bad, interval_s=0.02, timeout_s=0.5)
            tier = RedisTier(bad, timeout_s=0.5)
            try:
                leases.take("k", RATES, 0)
                await _until(lambda leases=leases: not leases.available)
                assert leases.take("k", RATES, 0) is None
                assert await tier.get(b"k", "t", "m") is None
                assert tier.errors == 1
            finally:
                await leases.close()
                await tier.close()
    finally:
        redis.kill()
