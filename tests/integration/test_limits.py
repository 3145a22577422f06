"""Rate limits and admission end to end: real routers, a real sim region, a real redis-server."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from router.access.auth import hash_key
from router.access.global_limits import UNLIMITED, GlobalLeases, Rates
from router.access.leasing import LeasePolicy, accuracy_bound, credit, max_slice
from router.core.timing import parse_server_timing
from router.native import count_request_tokens, encoding_for_model
from router.net.redis_client import hash_tagged
from tests.integration.conftest import region_toml, sim_stats, start_router, start_sim
from tests.support import Proc, redis_server_binary, start_redis

pytestmark = pytest.mark.skipif(redis_server_binary() is None, reason="needs redis-server")

# name -> extra [[auth.keys]] fields; every key gets its own buckets.
KEYS: dict[str, str] = {
    "burst": "requests_per_minute = 60\nrequest_burst = 100",
    "steady": "requests_per_minute = 1200\nrequest_burst = 20",
    "small1": "requests_per_minute = 60\nrequest_burst = 4",
    "small2": "requests_per_minute = 60\nrequest_burst = 4",
    "small3": "requests_per_minute = 60\nrequest_burst = 4",
    "tokens": "tokens_per_minute = 600\ntoken_burst = 1000",
    "tokens600": "tokens_per_minute = 600",
    "conc": "max_concurrent = 1",
    "both": "requests_per_minute = 60\nrequest_burst = 100\ntokens_per_minute = 6000\n"
    "token_burst = 10000",
    "open": "",
}
BODY = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
# 150 words and 10 completion tokens: each request reserves over 90 tokens (the sim says it
# used over 160).
BIG = {
    "model": "sim-1",
    "messages": [{"role": "user", "content": " ".join(["a"] * 150)}],
    "max_tokens": 10,
}
TIMEOUT = aiohttp.ClientTimeout(total=10)


def key_of(name: str) -> str:
    return f"sk-{name}-0123456789abcdef"


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key_of(name)}"}


def _config(sim: Proc, limits: str = "", admission: str = "", *regions: Proc) -> str:
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{hash_key(key_of(n))}"\ntenant = "{n}"\n{extra}\n'
        for n, extra in KEYS.items()
    )
    region_text = "".join(region_toml(r) for r in (regions or (sim,)))
    return (
        f"[auth]\n{keys}\n[limits]\ndefault_max_tokens = 800\nredis_retry_s = 0.2\n{limits}\n"
        f"[admission]\n{admission}\n{region_text}"
    )


def _redis_limits(redis: Proc, extra: str = "") -> str:
    return f'backend = "redis"\nredis_url = "redis://127.0.0.1:{redis.port}/0"\n{extra}'


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_sim(tmp_path_factory.mktemp("sim"), "a")
    yield proc
    proc.kill()


@pytest.fixture
def routers(tmp_path: Path) -> Iterator[list[Proc]]:
    """Routers started by a test; killed afterwards."""
    procs: list[Proc] = []
    yield procs
    for proc in procs:
        proc.kill()


def _start(routers: list[Proc], tmp: Path, text: str) -> Proc:
    proc = start_router(tmp, text)
    routers.append(proc)
    return proc


async def _post(
    session: aiohttp.ClientSession,
    router: Proc,
    name: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    async with session.post(
        router.url + "/v1/chat/completions",
        json=body or BODY,
        headers={**auth(name), **(headers or {})},
    ) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def _burst(
    session: aiohttp.ClientSession, targets: Sequence[Proc], name: str, n: int
) -> list[int]:
    """`n` requests at once, spread over `targets`; their statuses."""
    answers = await asyncio.gather(
        *(_post(session, targets[i % len(targets)], name) for i in range(n))
    )
    return [status for status, _, _ in answers]


async def _paced(
    session: aiohttp.ClientSession, targets: Sequence[Proc], name: str, rate: float, seconds: float
) -> tuple[list[int], float]:
    """`rate` requests per second for `seconds`, round robin over `targets`: statuses, span."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    sent: list[float] = []

    async def one(i: int) -> int:
        await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
        sent.append(loop.time())
        status, _, _ = await _post(session, targets[i % len(targets)], name)
        return status

    statuses = await asyncio.gather(*(one(i) for i in range(int(rate * seconds))))
    return list(statuses), max(sent) - min(sent)


async def _post_honoring_retry_after(
    session: aiohttp.ClientSession, router: Proc, name: str, body: dict[str, Any]
) -> tuple[int, dict[str, str]]:
    """A client that waits out retry-after-ms a few times, as the SDKs do."""
    for _ in range(5):
        status, headers, _ = await _post(session, router, name, body)
        if status != 429:
            break
        await asyncio.sleep(int(headers["retry-after-ms"]) / 1000)
    return status, headers


async def _sequential(
    session: aiohttp.ClientSession, targets: Sequence[Proc], name: str, n: int
) -> list[int]:
    return [(await _post(session, targets[i % len(targets)], name))[0] for i in range(n)]


async def _check_rates(targets: Sequence[Proc]) -> None:
    """Burst of key `burst` (100) and sustained rate of key `steady` (20/s), within 5% on one
    instance; within the documented leasing bound (docs/LIMITS.md) on several."""
    n = len(targets)
    policy = LeasePolicy()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        if n == 1:
            statuses = await _burst(session, targets, "burst", 150)
            assert statuses.count(200) == pytest.approx(100, rel=0.05)
        else:
            # Leases are answered locally, so a burst from nowhere outruns them: sequential.
            began = time.monotonic()
            statuses = await _sequential(session, targets, "burst", 150)
            span = time.monotonic() - began
            extra = accuracy_bound(policy, n, 100, 1).extra
            assert 100 - n * max_slice(policy, 100) <= statuses.count(200) <= 100 + span + extra
        assert set(statuses) <= {200, 429}
        # Offered at twice the rate for 10 s: the burst, then 20/s.
        statuses, span = await _paced(session, targets, "steady", rate=40, seconds=10)
    assert set(statuses) <= {200, 429}
    expected = 20 + 20 * span
    if n == 1:
        assert statuses.count(200) == pytest.approx(expected, rel=0.05)
    else:
        extra = accuracy_bound(policy, n, 20, 20 / 60).extra
        assert expected - n * max_slice(policy, 20) <= statuses.count(200) <= expected + extra


@pytest.mark.slow
async def test_one_instance_admits_burst_and_sustained_rate(
    sim: Proc, routers: list[Proc], tmp_path: Path
) -> None:
    router = _start(routers, tmp_path, _config(sim))
    await _check_rates([router])


@pytest.mark.slow
@pytest.mark.redis
async def test_two_instances_share_one_redis(
    sim: Proc, routers: list[Proc], tmp_path: Path, redis_proc: Proc
) -> None:
    # A generous timeout: on a starved machine a slow answer must not pass for an outage here.
    text = _config(sim, _redis_limits(redis_proc, "redis_timeout_ms = 2000"))
    pair = [_start(routers, tmp_path, text), _start(routers, tmp_path, text)]
    await _check_rates(pair)
    assert not any("unreachable" in p.output() for p in pair)


def _logged(proc: Proc, text: str) -> bool:
    return text in proc.output()


async def _until_logged(procs: Sequence[Proc], text: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not all(_logged(p, text) for p in procs):
        assert time.monotonic() < deadline, f"{text!r} never logged"
        await asyncio.sleep(0.05)


@pytest.mark.redis
async def test_redis_outage_keeps_local_limits_then_global_ones_resume(
    sim: Proc, routers: list[Proc], tmp_path: Path, redis_proc: Proc
) -> None:
    text = _config(sim, _redis_limits(redis_proc))
    pair = [_start(routers, tmp_path, text), _start(routers, tmp_path, text)]
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        # Shared: 4 in all, not 4 per instance.
        assert (await _sequential(session, pair, "small1", 10)).count(200) in (4, 5)
        redis_proc.kill()
        began = time.monotonic()
        statuses = await _sequential(session, pair, "small2", 10)
        # No 5xx, no request waiting on the dead Redis, and each instance's own 4 still hold.
        assert set(statuses) <= {200, 429}
        assert statuses.count(200) in (8, 9)
        assert time.monotonic() - began < 5
        assert all(_logged(p, "serving with local limits only") for p in pair)
        # Logged once per outage, not per request.
        assert all(p.output().count("unreachable") == 1 for p in pair)
        revived = start_redis(tmp_path, port=redis_proc.port)
        try:
            await _until_logged(pair, "global limits resumed")
            assert (await _sequential(session, pair, "small3", 10)).count(200) in (4, 5)
        finally:
            revived.kill()


@pytest.mark.redis
async def test_fail_closed_answers_503_while_redis_is_down(
    sim: Proc, routers: list[Proc], tmp_path: Path, redis_proc: Proc
) -> None:
    text = _config(sim, _redis_limits(redis_proc, 'on_redis_error = "closed"'))
    router = _start(routers, tmp_path, text)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        assert (await _post(session, router, "open"))[0] == 200
        assert (await _post(session, router, "small1"))[0] == 200
        redis_proc.kill()
        # The outage is noticed by the background keeper (a lease call or its heartbeat), not
        # by a request: until then the slice already held still admits.
        # The log says what this mode does (it used to say "serving with local limits only").
        await _until_logged([router], "refusing rate-limited keys' requests (503")
        assert not _logged(router, "serving with local limits only")
        for _ in range(3):
            status, headers, body = await _post(session, router, "small1")
            assert status == 503
            assert b'"rate_limit_store_unavailable"' in body
            assert int(headers["Retry-After"]) >= 1
        # Keys without limits never needed Redis.
        assert (await _post(session, router, "open"))[0] == 200


async def test_rate_headers_on_every_answer(sim: Proc, routers: list[Proc], tmp_path: Path) -> None:
    router = _start(routers, tmp_path, _config(sim))
    names = (
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    )
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        remaining = []
        for _ in range(4):
            status, headers, _ = await _post(session, router, "small1")
            assert status == 200
            assert all(n in headers for n in names)
            assert headers["x-ratelimit-limit-requests"] == "60"
            remaining.append(int(headers["x-ratelimit-remaining-requests"]))
        assert remaining == [3, 2, 1, 0]
        status, headers, _ = await _post(session, router, "small1")
        assert status == 429
        assert all(n in headers for n in names)
        assert int(headers["Retry-After"]) >= 1
        # A stream, and an answer the region failed, carry them too.
        stream = {**BODY, "stream": True}
        status, headers, _ = await _post(session, router, "small2", stream)
        assert status == 200
        assert headers["x-ratelimit-remaining-requests"] == "3"
        status, headers, _ = await _post(session, router, "small2", headers={"x-sim-fail": "500"})
        assert status >= 500
        assert headers["x-ratelimit-remaining-requests"] == "2"
        status, headers, _ = await _post(session, router, "tokens")
        assert status == 200
        assert "x-ratelimit-remaining-tokens" in headers
        assert "x-ratelimit-limit-requests" not in headers


@pytest.mark.parametrize("mode", ["body", "stream", "stream-without-usage"])
@pytest.mark.parametrize("backend", ["local", "redis"])
async def test_tokens_reserved_at_admission_are_reconciled_with_usage(
    sim: Proc,
    routers: list[Proc],
    tmp_path: Path,
    mode: str,
    backend: str,
    request: pytest.FixtureRequest,
) -> None:
    # Each request reserves its prompt + 800 (default_max_tokens) of a 1000-token bucket that
    # refills 10/s; the sim answers with a few tokens. Only giving back the unused reservation
    # (locally, and in Redis) lets the next request in. A stream without a usage chunk is
    # settled with a count of the text it carried.
    redis = request.getfixturevalue("redis_proc") if backend == "redis" else None
    limits = _redis_limits(redis, "redis_timeout_ms = 2000") if redis else ""
    router = _start(routers, tmp_path, _config(sim, limits))
    body: dict[str, Any] = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}]}
    if mode == "stream":
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    elif mode == "stream-without-usage":
        body |= {"stream": True}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        status, headers, _ = await _post(session, router, "tokens", body)
        assert status == 200
        assert int(headers["x-ratelimit-remaining-tokens"]) < 200
        for _ in range(3):
            status, headers = await _post_honoring_retry_after(session, router, "tokens", body)
            assert status == 200
            assert int(headers["x-ratelimit-remaining-tokens"]) < 200
    # Redis answered throughout: the shared buckets, not the local fallback, admitted these.
    assert "unreachable" not in router.output()


async def test_request_larger_than_the_bucket_is_refused_for_good(
    sim: Proc, routers: list[Proc], tmp_path: Path
) -> None:
    router = _start(routers, tmp_path, _config(sim))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        status, headers, body = await _post(session, router, "tokens", {**BODY, "max_tokens": 5000})
    assert status == 429
    assert b'"request_too_large"' in body
    assert headers["x-should-retry"] == "false"


async def test_max_concurrent_per_key(sim: Proc, routers: list[Proc], tmp_path: Path) -> None:
    router = _start(routers, tmp_path, _config(sim))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        slow = asyncio.create_task(
            _post(session, router, "conc", headers={"x-sim-ttft-ms": "1500"})
        )
        await asyncio.sleep(0.5)
        status, _, body = await _post(session, router, "conc")
        assert status == 429
        assert b'"concurrency_limit_exceeded"' in body
        assert (await slow)[0] == 200
        # The slot came back when the first answer ended.
        assert (await _post(session, router, "conc"))[0] == 200


async def test_full_region_spills_to_the_next_then_503(routers: list[Proc], tmp_path: Path) -> None:
    a, b = start_sim(tmp_path, "a"), start_sim(tmp_path, "b")
    try:
        admission = "max_in_flight = 1\nqueue_size = 0"
        router = _start(routers, tmp_path, _config(a, "", admission, a, b))
        hold = {"x-sim-ttft-ms": "1500"}
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            first = asyncio.create_task(_post(session, router, "open", headers=hold))
            await asyncio.sleep(0.3)
            second = asyncio.create_task(_post(session, router, "open", headers=hold))
            await asyncio.sleep(0.3)
            status, headers, body = await _post(session, router, "open")
            assert status == 503
            assert b'"overloaded"' in body
            assert int(headers["Retry-After"]) >= 1
            answers = [await first, await second]
        assert [s for s, _, _ in answers] == [200, 200]
        # Each region took one: the second request spilled over instead of waiting.
        assert (sim_stats(a)["requests"], sim_stats(b)["requests"]) == (1, 1)
    finally:
        a.kill()
        b.kill()


async def test_queued_request_waits_for_the_slot_and_reports_its_wait(
    routers: list[Proc], tmp_path: Path
) -> None:
    a = start_sim(tmp_path, "only")
    try:
        admission = "max_in_flight = 1\nqueue_size = 4\nmax_wait_s = 10"
        router = _start(routers, tmp_path, _config(a, "", admission, a))
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            first = asyncio.create_task(
                _post(session, router, "open", headers={"x-sim-ttft-ms": "800"})
            )
            await asyncio.sleep(0.3)
            status, headers, _ = await _post(session, router, "open")
            assert status == 200
            assert (await first)[0] == 200
        queue_ms = parse_server_timing(headers["Server-Timing"])["queue"]
        assert queue_ms > 100  # it waited for the first answer's slot instead of being refused
    finally:
        a.kill()


@pytest.mark.redis
async def test_frozen_redis_costs_one_short_timeout_then_nothing(
    sim: Proc, routers: list[Proc], tmp_path: Path, redis_proc: Proc
) -> None:
    # SIGSTOP: connections stay open but nothing answers, the case only a timeout catches.
    router = _start(routers, tmp_path, _config(sim, _redis_limits(redis_proc)))
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        assert (await _post(session, router, "steady"))[0] == 200
        redis_proc.popen.send_signal(signal.SIGSTOP)
        try:
            took, statuses = [], []
            for _ in range(10):
                began = time.monotonic()
                status, _, _ = await _post(session, router, "steady")
                took.append(time.monotonic() - began)
                statuses.append(status)
            # No request waits on the frozen Redis: what was leased (and credit) admits, then
            # 429 until the keeper's call times out (redis_timeout_ms), then local limits.
            assert set(statuses) <= {200, 429}
            assert sum(took) < 2
            await _until_logged([router], "serving with local limits only")
            assert (await _post(session, router, "steady"))[0] == 200
            assert router.output().count("unreachable") == 1
        finally:
            redis_proc.popen.send_signal(signal.SIGCONT)
        await _until_logged([router], "global limits resumed")
        assert (await _post(session, router, "steady"))[0] == 200


@pytest.mark.redis
async def test_leases_of_one_bucket_admit_it_exactly_and_go_back(redis_proc: Proc) -> None:
    # Three instances, a bucket of 50 that (almost) never refills: credit is charged and slices
    # come out of the bucket, so together they admit exactly what it held; closing gives back
    # what was still held.
    url = f"redis://127.0.0.1:{redis_proc.port}/0"
    pops = [GlobalLeases(url, interval_s=0.02) for _ in range(3)]
    rates = Rates(
        request_capacity=50, requests_per_s=1e-6, token_capacity=UNLIMITED, tokens_per_s=1
    )
    admitted = [0, 0, 0]
    try:
        for _ in range(60):
            for i, pop in enumerate(pops):
                verdict = pop.take("k", rates, 0)
                assert verdict is not None
                admitted[i] += verdict[0]
            await asyncio.sleep(0.01)
    finally:
        for pop in pops:
            await pop.close()
    assert sum(admitted) <= 50
    assert sum(admitted) >= 50 - 3 * max_slice(LeasePolicy(), 50)
    assert all(pop.outages == 0 for pop in pops)
    client = aioredis.Redis(port=redis_proc.port)
    try:
        left = float(await client.hget(pops[0].key("k"), "r") or 0)
    finally:
        await client.aclose()
    assert left == pytest.approx(50 - sum(admitted), abs=0.01)


async def test_a_refusal_never_claims_requests_remain(redis_proc: Proc) -> None:
    # Two instances on one bucket of 10 refilling at 1/s, each asked 5 at a time 4 times a
    # second: once one is refused, what it reports remaining is what it could admit then
    # (nothing), not the global level at its last sync (the other's slice, what Redis keeps).
    url = f"redis://127.0.0.1:{redis_proc.port}/0"
    pops = [GlobalLeases(url, interval_s=0.05) for _ in range(2)]
    rates = Rates(request_capacity=10, requests_per_s=1, token_capacity=UNLIMITED, tokens_per_s=1)
    refusals: list[int] = []
    try:
        for _ in range(12):
            for pop in pops:
                for _ in range(5):
                    verdict = pop.take("k", rates, 0)
                    assert verdict is not None
                    if not verdict[0]:
                        refusals.append(verdict[2])
            await asyncio.sleep(0.25)
    finally:
        for pop in pops:
            await pop.close()
    assert refusals
    assert set(refusals) == {0}


@pytest.mark.redis
async def test_first_answer_on_credit_says_what_remains(
    sim: Proc, routers: list[Proc], tmp_path: Path, redis_proc: Proc
) -> None:
    # A fresh router holds no slice of the key's global bucket (burst 100) and admits its first
    # request on credit (5 of 100): its headers said 0 requests and 0 tokens remained, and the
    # next request was admitted all the same. What this router may still admit is the credit it
    # has left (the global level is unknown until Redis answers); tokens, the local bucket's.
    router = _start(routers, tmp_path, _config(sim, _redis_limits(redis_proc)))
    left = credit(LeasePolicy(), 100) - 1
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        status, headers, _ = await _post(session, router, "both")
        assert status == 200
        assert headers["x-ratelimit-remaining-requests"] == str(left)
        assert 0 < int(headers["x-ratelimit-remaining-tokens"]) <= 10000
        # ... and that many are admitted, on credit or from the slice leased meanwhile.
        assert await _sequential(session, [router], "both", left) == [200] * left
    assert "unreachable" not in router.output()


async def test_admissions_on_credit_never_claim_fewer_remain_than_are_admitted(
    redis_proc: Proc,
) -> None:
    # One instance, a bucket of 100 (credit 5) that (almost) never refills and holds 8. Asked
    # synchronously (no lease answer in between), the instance admits on credit before its
    # first answer, and again once its slice ran out while Redis had granted all it asked:
    # each admission must report at least as many remaining as it then admits (it said 0).
    url = f"redis://127.0.0.1:{redis_proc.port}/0"
    # A tick too long to come: the only calls are the ones a take kicks.
    pop = GlobalLeases(url, interval_s=10.0)
    rates = Rates(
        request_capacity=100, requests_per_s=1e-6, token_capacity=UNLIMITED, tokens_per_s=1
    )
    admin = aioredis.Redis(port=redis_proc.port)
    # A refill stamp in the future: no refill until the first call.
    await admin.hset(pop.key("k"), mapping={"r": 8, "ts": 1e12})

    def run() -> list[int]:
        """Remaining of each admission until the first refusal (which reports its own)."""
        said: list[int] = []
        while (verdict := pop.take("k", rates, 0)) is not None and verdict[0]:
            said.append(verdict[2])
            assert len(said) <= 100
        assert verdict is not None
        said.append(verdict[2])
        return said

    try:
        first = run()
        # Redis answers: the 5 on credit paid, a slice of at most 3 (6 wanted in 2.5 s or
        # more, over a horizon of 1 s) granted in full.
        deadline = time.monotonic() + 20
        while not pop.leases["k"].leased or pop.leases["k"].scarce:
            assert time.monotonic() < deadline, "no lease answer"
            await asyncio.sleep(0.01)
        second = run()
    finally:
        await pop.close()
        await admin.aclose()
    assert len(first) - 1 == credit(LeasePolicy(), 100)
    # Refused: nothing left here; admitted: at least as many as then were.
    understated = [
        said
        for said in (first, second)
        if said[-1] != 0 or any(n < len(said) - 2 - i for i, n in enumerate(said[:-1]))
    ]
    assert not understated, (first, second)


def _reserved(body: dict[str, Any]) -> int:
    """The tokens the router reserves for `body` (a model it has no tokenizer for: estimated)."""
    return count_request_tokens(json.dumps(body).encode(), encoding_for_model(body["model"])) + int(
        body["max_tokens"]
    )


def _seconds(reset: str) -> float:
    """An x-ratelimit-reset-* value (250ms, 1.5s, 6m0s) in seconds."""
    if reset.endswith("ms"):
        return float(reset[:-2]) / 1000
    minutes, _, rest = reset.rpartition("m")
    return float(minutes or 0) * 60 + float(rest.removesuffix("s") or 0)


@pytest.mark.redis
async def test_global_token_refusal_waits_out_the_debt(
    sim: Proc, routers: list[Proc], tmp_path: Path, redis_proc: Proc
) -> None:
    # Two routers share a key of 600 tokens a minute whose global bucket is 600 tokens in debt
    # (as credit can leave it, up to one burst). Each admits its first request on credit; the
    # next one needs the debt paid and its own tokens: over a minute at 10/s. A 429 for tokens
    # in global mode said 250 ms (the lease interval) whatever the wait.
    reserved = _reserved(BIG)
    text = _config(sim, _redis_limits(redis_proc))
    pair = [_start(routers, tmp_path, text) for _ in range(2)]
    admin = aioredis.Redis(port=redis_proc.port)
    try:
        seconds, micros = await admin.time()
        key = hash_tagged("router:rl:", hash_key(key_of("tokens600"))[:16])
        await admin.hset(key, mapping={"t": -600, "ts": seconds + micros / 1e6})
    finally:
        await admin.aclose()
    began = time.monotonic()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for router in pair:
            assert (await _post(session, router, "tokens600", BIG))[0] == 200  # on credit
        for router in pair:
            # Refused with the interval until the router's first lease answer is in.
            deadline = time.monotonic() + 20
            while True:
                status, headers, _ = await _post(session, router, "tokens600", BIG)
                assert status == 429
                if int(headers["retry-after-ms"]) > 250 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.25)
            retry_s = int(headers["retry-after-ms"]) / 1000
            # The debt, refilled since, less this router's slice: what 160 tokens wait for.
            lacking = reserved + 600 - int(headers["x-ratelimit-remaining-tokens"]) - 1
            needed = lacking / 10 - (time.monotonic() - began)
            assert retry_s >= needed - 1, (retry_s, needed, headers)
            assert int(headers["Retry-After"]) == math.ceil(retry_s)
            assert _seconds(headers["x-ratelimit-reset-tokens"]) >= retry_s - 0.5, headers


@pytest.mark.redis
async def test_client_obeying_global_token_waits_is_rarely_refused(
    sim: Proc, routers: list[Proc], tmp_path: Path, redis_proc: Proc
) -> None:
    # Two routers share a key of 600 tokens a minute; a client sends requests of about 160
    # tokens to each in turn for 12 s, waiting out every 429's retry-after-ms. The bucket admits
    # a few at first and one every 16 s after: the waits said 250 ms each time, and the client
    # was refused about 45 times.
    text = _config(sim, _redis_limits(redis_proc))
    pair = [_start(routers, tmp_path, text) for _ in range(2)]
    statuses: list[int] = []
    waits: list[int] = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        end = time.monotonic() + 12
        while time.monotonic() < end:
            router = pair[len(statuses) % 2]
            status, headers, _ = await _post(session, router, "tokens600", BIG)
            statuses.append(status)
            if status == 429:
                waits.append(int(headers["retry-after-ms"]))
                await asyncio.sleep(min(waits[-1] / 1000, max(0.0, end - time.monotonic())))
    assert set(statuses) <= {200, 429}
    admitted = statuses.count(200)
    assert 2 <= admitted <= 6, statuses
    assert len(waits) <= 2 * admitted + 4, (statuses, waits)
    assert max(waits) > 2000, waits
