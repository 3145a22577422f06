"""Tier 2 against a real redis-server: sharing, TTL, namespaces, purge, and outage degradation."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import pytest

from router.cache.policy import Entry
from router.cache.redis_tier import RedisTier, redis_key
from tests.support import Proc, free_port, start_redis

pytestmark = pytest.mark.redis


def entry(ns: str = "t", model: str = "m", ttl: float = 60.0, body: bytes = b"{}") -> Entry:
    now = time.time()
    return Entry(
        namespace=ns,
        model=model,
        content_type="application/json",
        created=now,
        expires=now + ttl,
        body=body,
    )


@pytest.fixture
async def tier(redis_proc: Proc) -> AsyncIterator[RedisTier]:
    t = RedisTier(f"redis://127.0.0.1:{redis_proc.port}/0", timeout_s=0.5)
    yield t
    await t.close()


async def test_two_clients_share_entries(redis_proc: Proc, tier: RedisTier) -> None:
    other = RedisTier(f"redis://127.0.0.1:{redis_proc.port}/0", timeout_s=0.5)
    try:
        e = entry(body=b'{"answer": 42}')
        assert await tier.put(b"k", e)
        assert await other.get(b"k", "t", "m") == e
        assert await other.get(b"k", "other-tenant", "m") is None
    finally:
        await other.close()


async def test_ttl_is_set_on_the_redis_key(redis_proc: Proc, tier: RedisTier) -> None:
    await tier.put(b"k", entry(ttl=30))
    ttl = await tier._client.pttl(redis_key(tier.prefix, b"k", "t", "m"))
    assert 0 < ttl <= 30_000


async def test_values_are_compressed(tier: RedisTier) -> None:
    body = b'{"text": "' + b"repeat " * 2000 + b'"}'
    await tier.put(b"k", entry(body=body))
    raw = await tier._client.get(redis_key(tier.prefix, b"k", "t", "m"))
    assert isinstance(raw, bytes)
    assert len(raw) < len(body) / 10


async def test_foreign_value_under_our_key_is_a_miss(tier: RedisTier) -> None:
    await tier._client.set(redis_key(tier.prefix, b"k", "t", "m"), b"garbage")
    assert await tier.get(b"k", "t", "m") is None


async def test_purge_by_namespace_model_and_all(tier: RedisTier) -> None:
    await tier.put(b"1", entry(ns="a:b*", model="m1"))
    await tier.put(b"2", entry(ns="a", model="m1"))
    await tier.put(b"3", entry(ns="a", model="m2"))
    await tier.put(b"4", entry(ns="c", model="m2"))
    assert await tier.purge(namespace="a", model="m1") == 1
    assert await tier.get(b"1", "a:b*", "m1") is not None  # glob characters and ":" are quoted
    assert await tier.purge(model="m2") == 2
    assert await tier.purge() == 1
    assert await tier.get(b"1", "a:b*", "m1") is None


async def test_outage_degrades_warns_once_and_recovers(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    now = [0.0]
    tier = RedisTier(
        f"redis://127.0.0.1:{port}/0", timeout_s=0.5, retry_after_s=1.0, clock=lambda: now[0]
    )
    try:
        with caplog.at_level(logging.WARNING, logger="router"):
            for _ in range(5):
                assert await tier.get(b"k", "t", "m") is None
                assert not await tier.put(b"k", entry())
            assert not tier.up
            assert tier.errors == 1  # the others were skipped while backing off
            now[0] += 1.5
            assert await tier.get(b"k", "t", "m") is None
            assert tier.errors == 2
            warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
            assert len(warnings) == 1
            redis = start_redis(tmp_path_factory.mktemp("redis"), port)
            try:
                now[0] += 1.5
                assert await tier.put(b"k", entry())
                assert tier.up
                assert await tier.get(b"k", "t", "m") is not None
                assert any("recovered" in r.getMessage() for r in caplog.records)
            finally:
                redis.kill()
            now[0] += 1.5
            assert await tier.get(b"k", "t", "m") is None
            assert not tier.up
    finally:
        await tier.close()
