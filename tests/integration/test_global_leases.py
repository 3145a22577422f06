"""GlobalLeases against a real redis-server that answers errors: for one key, or for all."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from router.access.global_limits import UNLIMITED, GlobalLeases, Rates
from tests.support import Proc

pytestmark = pytest.mark.redis

RATES = Rates(request_capacity=100, requests_per_s=100, token_capacity=UNLIMITED, tokens_per_s=1)


async def _until(check: Callable[[], bool], leases: GlobalLeases, keys: list[str]) -> None:
    """Ask for every key until `check` holds (a liveness bound, not a timing one)."""
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        for key in keys:
            leases.take(key, RATES, 0)
        await asyncio.sleep(0.01)


@pytest.fixture
async def admin(redis_proc: Proc) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=redis_proc.port)
    yield client
    await client.aclose()


@pytest.fixture
async def leases(redis_proc: Proc) -> AsyncIterator[GlobalLeases]:
    pop = GlobalLeases(
        f"redis://127.0.0.1:{redis_proc.port}/0", interval_s=0.02, retry_s=0.05, timeout_s=2.0
    )
    yield pop
    await pop.close()


async def test_one_key_of_the_wrong_type_fails_alone(
    leases: GlobalLeases, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await admin.set(leases.key("bad"), b"not-a-hash")
    keys = ["good", "bad"]
    with caplog.at_level(logging.WARNING, logger="router"):
        # Both keys ask in the same calls: what Redis grants "good" is kept.
        await _until(lambda: leases.syncs >= 5, leases, keys)
        assert leases.outages == 0  # was: one outage for all keys after another
        assert "bad" in leases.failing
        await _until(lambda: "good" in leases.leases and leases.leases["good"].leased, leases, keys)
        failures = leases.failing["bad"]
        # Tried again every retry_s, and failing again, with global limits on for the others.
        await _until(lambda: leases.failing["bad"] > failures, leases, keys)
        assert leases.available
        assert leases.outages == 0
        assert leases.take("bad", RATES, 0) is None  # local limits only for it
        assert leases.take("good", RATES, 0) is not None
        assert leases.leases["good"].leased
        said = [r.getMessage() for r in caplog.records]
        assert sum("key bad failed" in m for m in said) == 1
        assert not any("unreachable" in m for m in said)
        await admin.delete(leases.key("bad"))
        await _until(lambda: "bad" in leases.leases and leases.leases["bad"].leased, leases, keys)
        assert "bad" not in leases.failing
        assert any("key bad answered again" in r.getMessage() for r in caplog.records)
    assert leases.outages == 0


async def test_redis_refusing_every_write_is_one_outage_until_the_script_runs(
    leases: GlobalLeases, admin: aioredis.Redis, redis_proc: Proc
) -> None:
    await _until(lambda: "k" in leases.leases and leases.leases["k"].leased, leases, ["k"])
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", 1)  # every EVAL that writes: OOM; PING still answers
    try:
        await _until(lambda: not leases.available, leases, ["k"])
        evals = await _evals(admin)
        # Many probes later (each runs the script), still out: PING alone let it flap back.
        await _until_evals(leases, admin, evals + 10)
        assert not leases.available
        assert leases.outages == 1
    finally:
        await admin.config_set("maxmemory", 0)
    await _until(lambda: leases.available, leases, ["k"])
    await _until(lambda: "k" in leases.leases and leases.leases["k"].leased, leases, ["k"])
    assert leases.outages == 1


async def _evals(admin: aioredis.Redis) -> int:
    stats = await admin.info("commandstats")
    return int(stats.get("cmdstat_eval", {}).get("calls", 0))


async def _until_evals(leases: GlobalLeases, admin: aioredis.Redis, at_least: int) -> None:
    """Ask for "k" until Redis has run `at_least` EVALs in all."""
    deadline = time.monotonic() + 20
    while await _evals(admin) < at_least:
        assert time.monotonic() < deadline, "condition never held"
        leases.take("k", RATES, 0)
        await asyncio.sleep(0.01)


# A key limited on tokens only: 600 a minute (10/s), a burst of 600.
TOKENS = Rates(request_capacity=UNLIMITED, requests_per_s=1, token_capacity=600, tokens_per_s=10)


async def _until_leased(leases: GlobalLeases, key: str, rates: Rates) -> None:
    deadline = time.monotonic() + 20
    while key not in leases.leases or not leases.leases[key].leased:
        assert time.monotonic() < deadline, "no lease answer"
        await asyncio.sleep(0.01)


async def _level(admin: aioredis.Redis, leases: GlobalLeases, key: str, rates: Rates) -> float:
    """The key's global token level now, as the lease script would refill it."""
    tokens, stamp = await admin.hmget(leases.key(key), ["t", "ts"])
    seconds, micros = await admin.time()
    elapsed = max(0.0, seconds + micros / 1e6 - float(stamp or 0))
    return min(rates.token_capacity, float(tokens or 0) + elapsed * rates.tokens_per_s)


async def test_a_token_refusal_waits_for_the_tokens_the_request_needs(
    leases: GlobalLeases, admin: aioredis.Redis
) -> None:
    # Drained by 160-token requests: a refusal's wait is the time the global bucket needs for
    # what the request lacks (it was the lease interval, 20 ms here, whatever the tokens). The
    # level read just before a take, with no call begun or answered meanwhile, is the one the
    # instance last heard of, refilled since.
    first = leases.take("k", TOKENS, 160)  # on credit
    assert first is not None
    assert first[0]
    await _until_leased(leases, "k", TOKENS)
    deadline = time.monotonic() + 20
    lacking = 0.0
    while lacking < 20:  # a refusal that must wait 2 s or more
        assert time.monotonic() < deadline, "never refused for want of tokens"
        await asyncio.sleep(0.01)
        calls = leases.syncs
        level = await _level(admin, leases, "k", TOKENS)
        if leases.leases["k"].syncing or leases.syncs != calls:
            continue
        verdict = leases.take("k", TOKENS, 160)
        assert verdict is not None
        allowed, retry_s, _, held, _, reset_tokens_s = verdict
        if allowed:
            continue
        lacking = 160 - held - level
        assert retry_s >= lacking / TOKENS.tokens_per_s - 0.5, (retry_s, lacking)
        assert reset_tokens_s >= retry_s - 0.5


async def test_a_token_refusal_counts_the_global_debt(
    leases: GlobalLeases, admin: aioredis.Redis
) -> None:
    # The global bucket 600 tokens in debt (bounded by one burst, as credit can leave it): the
    # first request is admitted on credit (and adds to the debt), the next one waits for the debt
    # and its own tokens, over 76 s.
    seconds, micros = await admin.time()
    await admin.hset(leases.key("k"), mapping={"t": -600, "ts": seconds + micros / 1e6})
    first = leases.take("k", TOKENS, 160)
    assert first is not None
    assert first[0]
    await _until_leased(leases, "k", TOKENS)
    verdict = leases.take("k", TOKENS, 160)
    assert verdict is not None
    allowed, retry_s, _, _, _, reset_tokens_s = verdict
    assert not allowed
    assert retry_s >= 60, retry_s
    assert reset_tokens_s >= retry_s - 0.5


async def test_a_tokens_only_key_is_topped_up_before_the_tick(redis_proc: Proc) -> None:
    # A tick too long to come (9-11 s): a key limited on tokens only, its slice used up, asks
    # Redis at once, as a key limited on requests does (its requests goal is 0, so it waited
    # for the tick).
    pop = GlobalLeases(f"redis://127.0.0.1:{redis_proc.port}/0", interval_s=10.0)
    rates = Rates(
        request_capacity=UNLIMITED, requests_per_s=1, token_capacity=10_000, tokens_per_s=10
    )
    try:
        first = pop.take("k", rates, 100)  # on credit; the first answer grants a slice
        assert first is not None
        assert first[0]
        await _until_leased(pop, "k", rates)
        began = time.monotonic()
        admitted = 1
        while admitted < 4:
            verdict = pop.take("k", rates, 100)
            assert verdict is not None
            admitted += verdict[0]
            assert time.monotonic() - began < 5, f"{admitted} admitted, {pop.syncs} calls"
            await asyncio.sleep(0.01)
    finally:
        await pop.close()
