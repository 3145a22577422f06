"""Cost of rate limiting per request: local (Rust buckets) in process, and the Redis round trip.

Local: the auth + limit path of one request (key lookup, token estimate, admit, settle) and a
bare BucketTable.try_acquire, in CPU ns per call. Global: GlobalLeases.take (the local slice
of a global bucket leased from a real redis-server on 127.0.0.1, no network wait per request),
wall us per call, and how many background calls the leases cost. Every phase checks the number
admitted is exactly what the limits allow.

    python bench/limits.py [--requests 20000] [--redis-requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop
from multidict import CIMultiDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import start_redis

from router.access.auth import Authenticator, Tenant, hash_key
from router.access.global_limits import GlobalLeases, Rates
from router.access.limits import Limiter
from router.core.request import parse_body
from router.native import BucketTable

KEY = "sk-bench-0123456789abcdef"
BODY = (
    b'{"model": "gpt-4o-mini", "max_tokens": 64, "messages": ['
    b'{"role": "system", "content": "You are a terse assistant."},'
    b'{"role": "user", "content": "Name three failure modes of a multi-region router."}]}'
)


def tenant(requests_per_minute: int, burst: int) -> Tenant:
    return Tenant(
        key_id=hash_key(KEY)[:16],
        name="bench",
        models=None,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=10**9,
        request_burst=burst,
        token_burst=None,
        max_concurrent=None,
        priority=0,
        cache_namespace="bench",
    )


def bench_table(n: int) -> float:
    """CPU ns per BucketTable.try_acquire; exactly the burst is admitted."""
    table = BucketTable()
    table.set_limits("k", requests_per_minute=1, tokens_per_minute=10**9, request_burst=n // 2)
    acquire = table.try_acquire
    start = time.thread_time_ns()
    admitted = sum(1 for _ in range(n) if acquire("k", 100)[0])
    spent = time.thread_time_ns() - start
    assert admitted == n // 2, admitted
    return spent / n


async def bench_request_path(n: int) -> float:
    """CPU ns per request of auth + estimate + admit + settle, as the router runs them."""
    who = tenant(requests_per_minute=1, burst=n // 2)
    auth = Authenticator([(hash_key(KEY), who)])
    limiter = Limiter([who], default_max_tokens=256)
    headers = CIMultiDict({"Authorization": f"Bearer {KEY}"})
    parsed = parse_body("/v1/chat/completions", BODY)
    admitted = 0
    start = time.thread_time_ns()
    for _ in range(n):
        found = auth.authenticate(headers)
        auth.authorize_model(found, parsed.model)
        try:
            grant = await limiter.admit(found, limiter.estimate(parsed))
        except Exception:
            continue
        admitted += 1
        grant.finish(40)
    spent = time.thread_time_ns() - start
    assert admitted == n // 2, admitted
    return spent / n


async def bench_redis(url: str, n: int) -> tuple[list[float], int]:
    """Wall-clock us per GlobalLeases.take until the global bucket (n / 2, no refill) is spent,
    and the Redis calls that cost. Exactly the bucket is admitted: credit is charged, slices
    come out of it."""
    leases = GlobalLeases(url, timeout_s=1.0, interval_s=0.01)
    rates = Rates(request_capacity=n // 2, requests_per_s=1e-9, token_capacity=1e12, tokens_per_s=1)
    try:
        samples: list[float] = []
        admitted = 0
        quiet = 0
        while quiet < 20:
            began = time.perf_counter()
            verdict = leases.take("seq", rates, 1)
            samples.append((time.perf_counter() - began) * 1e6)
            assert verdict is not None
            admitted += verdict[0]
            # Denied: the slice is spent; let the keeper fetch more (there is none at the end).
            quiet = 0 if verdict[0] else quiet + 1
            if not verdict[0]:
                await asyncio.sleep(0.01)
        assert admitted == n // 2, admitted
        assert leases.outages == 0
        return samples, leases.syncs
    finally:
        await leases.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--redis-requests", type=int, default=2000)
    args = parser.parse_args()
    table_ns = min(bench_table(args.requests) for _ in range(3))
    path_ns = min(uvloop.run(bench_request_path(args.requests)) for _ in range(3))
    with tempfile.TemporaryDirectory() as tmp:
        redis = start_redis(Path(tmp))
        try:
            url = f"redis://127.0.0.1:{redis.port}/0"
            samples, calls = uvloop.run(bench_redis(url, args.redis_requests))
        finally:
            redis.kill()
    q = statistics.quantiles(samples, n=100)
    print(f"local  BucketTable.try_acquire          {table_ns:10.0f} ns/call (CPU)")
    print(f"local  auth + estimate + admit + settle {path_ns:10.0f} ns/request (CPU)")
    print(
        f"global take from a leased slice        p50 {q[49]:7.2f} us  p99 {q[98]:7.2f} us  "
        f"max {max(samples):7.0f} us (wall)"
    )
    print(
        f"global background lease calls          {calls:10d} "
        f"for {args.redis_requests // 2} admitted"
    )


if __name__ == "__main__":
    main()
