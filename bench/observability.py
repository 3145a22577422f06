"""Per-request cost of observability: metrics + SLO + access log + Server-Timing, with and without.

Drives the instrumentation in-process over N synthetic requests (no sockets), checks the
metrics and the log saw exactly N requests, and prints microseconds per request.

    python -m bench.observability [--requests 20000] [--rounds 5] [--e2e 3000]

With --e2e N it also starts a zero-delay sim region and two routers (observability on and off)
and sends each N sequential requests per round, measuring the router process's CPU time per
request from /proc/<pid>/task/*/schedstat (ns, all threads), which shared cores do not inflate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from router.core.timing import STAGES, StageTimer, server_timing
from router.observability.access_log import AccessLog, AccessRecord
from router.observability.metrics import RegionState, Telemetry

REGIONS = ("eu-west", "us-east", "ap-south")
MODELS = ("gpt-4o-mini", "llama-3-8b")
CACHE = ("hit", "miss", "miss", "bypass")
STATUS = (200, 200, 200, 200, 200, 200, 200, 429, 502, 200)

Synthetic = tuple[str, str, str, int, list[tuple[str, int]]]


def synthetic(i: int) -> Synthetic:
    """Deterministic labels and stage durations for request `i`."""
    stages = [(name, 1000 + (i * 7919 + k * 104729) % 5_000_000) for k, name in enumerate(STAGES)]
    return REGIONS[i % 3], MODELS[i % 2], CACHE[i % 4], STATUS[i % 10], stages


def run(inputs: list[Synthetic], instrument: Callable[[int, StageTimer], None] | None) -> float:
    """CPU seconds of this thread to handle the synthetic requests, instrumented or not.

    CPU time, not wall time: the bench shares its cores with other work, and time spent
    waiting for a core is not the instrumentation's cost.
    """
    start = time.thread_time()
    for i, (_, _, _, _, stages) in enumerate(inputs):
        # The request context times its stages either way; that is the router's, not ours.
        timer = StageTimer()
        for name, ns in stages:
            timer.record(name, ns)
        if instrument is not None:
            instrument(i, timer)
    return time.thread_time() - start


def instrumenter(
    telemetry: Telemetry, inputs: list[Synthetic]
) -> Callable[[int, StageTimer], None]:
    """What the router does per request for observability: header, record, metrics, log."""

    def instrument(i: int, timer: StageTimer) -> None:
        region, model, cache, status, _ = inputs[i]
        durations = dict(timer.durations)
        header = server_timing(durations)
        assert header
        telemetry.finish(
            AccessRecord(
                request_id=f"req-{i}", path="/v1/chat/completions", status=status,
                tenant="bench", model=model, region=region, attempts=1, cache=cache,
                stages=durations, tokens_in=20, tokens_out=100,
            )
        )  # fmt: skip

    return instrument


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--e2e", type=int, default=0, help="requests per round end to end")
    parser.add_argument("--e2e-rounds", type=int, default=11)
    args = parser.parse_args()
    n: int = args.requests
    inputs = [synthetic(i) for i in range(n)]
    states = [RegionState(r, True, 0.004, 1, 0, 0) for r in REGIONS]

    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "access.log"
        with log_path.open("w") as fh:
            log = AccessLog(stream=fh)
            telemetry = Telemetry(log=log, regions=lambda: states)
            no_log = Telemetry(regions=lambda: states)
            full_fn = instrumenter(telemetry, inputs)
            metrics_fn = instrumenter(no_log, inputs)
            base, full, metrics_only = [], [], []
            for _ in range(args.rounds):
                base.append(run(inputs, None))
                metrics_only.append(run(inputs, metrics_fn))
                full.append(run(inputs, full_fn))
            log.close()
        lines = log_path.read_text().count("\n")

    total = telemetry.metrics.registry.get_sample_value
    counted = sum(
        total("router_requests_total", {"region": r, "model": m, "status": str(s), "cache": c})
        or 0.0
        for r in REGIONS
        for m in MODELS
        for s in set(STATUS)
        for c in set(CACHE)
    )
    # The answer must be right as well as fast: every request counted once, logged once.
    assert counted == n * args.rounds, (counted, n * args.rounds)
    assert lines == n * args.rounds, (lines, n * args.rounds)
    scrape_start = time.thread_time()
    scrapes = 20
    for _ in range(scrapes):
        body, _ = telemetry.metrics.exposition()
    scrape_ms = (time.thread_time() - scrape_start) / scrapes * 1e3
    assert b"router_slo_compliant" in body

    print(
        f"requests per round: {n}, rounds: {args.rounds} (CPU us/request; min and median of rounds)"
    )
    for label, pick in (("min", min), ("median", statistics.median)):
        b_us = pick(base) / n * 1e6
        m_us = pick(metrics_only) / n * 1e6
        f_us = pick(full) / n * 1e6
        print(
            f"{label:>6}: without {b_us:6.2f} | metrics+SLO+Server-Timing {m_us - b_us:6.2f}"
            f" | + access log {f_us - b_us:6.2f} overhead (target < 30)"
        )
    print(f"/metrics scrape: {scrape_ms:.2f} ms for {len(body)} bytes")
    if args.e2e:
        end_to_end(args.e2e, args.e2e_rounds)
    return 0


def router_cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in ns."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError):  # a thread that just ended
            total += int(stat.read_text().split()[0])
    return total


async def drive(url: str, n: int, limit_s: float) -> list[float]:
    """n sequential chat requests (stopping early after limit_s); latencies in ms."""
    body = {"model": "sim-1", "messages": [{"role": "user", "content": "hello"}]}
    out: list[float] = []
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as http:
        for _ in range(n):
            if time.monotonic() > deadline:
                break
            began = time.perf_counter()
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            out.append((time.perf_counter() - began) * 1e3)
    assert out, "no request finished in time"
    return out


def end_to_end(n: int, rounds: int) -> None:
    """Router CPU per request with observability on vs off, same sim region."""
    from tests.integration.conftest import region_toml, start_router, start_sim
    from tests.support import is_access_line

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sim = start_sim(folder, "a")
        base = "[auth]\nenabled = false\n" + region_toml(sim)
        on = start_router(folder, base)
        off = start_router(folder, "[observability]\nenabled = false\n" + base)
        try:
            cpu: dict[str, list[float]] = {"on": [], "off": []}
            p50: dict[str, list[float]] = {"on": [], "off": []}
            for proc in (on, off):
                asyncio.run(drive(proc.url, 200, 30.0))  # warm pools and caches
            for _ in range(rounds):
                for name, proc in (("on", on), ("off", off)):
                    before = router_cpu_ns(proc.popen.pid)
                    lat = asyncio.run(drive(proc.url, n, 120.0))
                    cpu[name].append((router_cpu_ns(proc.popen.pid) - before) / len(lat) / 1e3)
                    p50[name].append(statistics.median(lat))
            lines = sum(1 for line in on.output().splitlines() if is_access_line(line))
            assert lines == 200 + n * rounds, lines  # one access line per request, none lost
            assert not any(is_access_line(line) for line in off.output().splitlines())
        finally:
            for proc in (on, off, sim):
                proc.kill()
    print(f"end to end, {n} sequential requests x {rounds} rounds, router CPU us/request:")
    for name in ("off", "on"):
        q1, med, q3 = statistics.quantiles(cpu[name], n=4)
        print(
            f"  observability {name:>3}: median {med:7.1f}  quartiles {q1:7.1f} .. {q3:7.1f}"
            f"  client p50 {statistics.median(p50[name]):.2f} ms"
        )
    diff = statistics.median(cpu["on"]) - statistics.median(cpu["off"])
    print(f"  difference of medians: {diff:.1f} us (noisy on shared cores; see README)")


if __name__ == "__main__":
    raise SystemExit(main())
