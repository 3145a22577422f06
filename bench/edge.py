"""Scenario "edge": three PoPs (routers), one Redis far from two of them; global limits and the
shared cache tier must keep the Redis round trip off the request path.

    python -m bench.edge [--delay-ms 40] [--requests 300] [--rpm 600] [--duration 20]
                         [--outage-s 10] [--after-s 20] [--prompts 20] [--json FILE]

The far PoPs reach Redis through a userspace relay that delays each direction by --delay-ms
(the kernel here has no netem): `python -m bench.edge relay --port P --target T --delay-ms D`.
(a) added latency per request at the far PoPs, global limits + shared cache tier on, over a
router with both off, same run, interleaved (targets: p50 < 0.5 ms, p99 < 2 ms);
(b) one key limited to --rpm globally, offered 3x that from the three PoPs for --duration s:
admitted within 10% of burst + rpm * duration / 60, each PoP at least a fifth of its share;
(c) the same drive with Redis killed for --outage-s and restarted (empty): no 5xx, admitted
rate back within the bound 10 s after; (d) the same prompts asked at the near PoP then at both
far ones, shared tier on vs off: origin requests, and TTFT of the far PoPs' hits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.outputs import check_file, check_folder
from tests.support import Proc, free_port, router_cmd, spawn, start_redis

from router.access.auth import hash_key
from router.access.leasing import LeasePolicy, accuracy_bound

MODEL = "sim-1"
FAST = "sk-edge-fast-0123456789"
LIMITED = "sk-edge-limited-0123456"
POPS = ("near", "far-1", "far-2")


# The relay: each direction's bytes leave `delay` after they arrived, in order, pipelined.


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = loop.create_task(deliver())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
        await sender
    finally:
        sender.cancel()
        with contextlib.suppress(OSError):
            writer.close()


async def relay(port: int, target: int, delay: float) -> None:
    """Accept on `port`, connect each client to `target`, delay both directions."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()  # the target is down: so is this connection
            return
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(_pump(reader, up_writer, delay), _pump(up_reader, writer, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


# Processes.


@dataclass
class Fleet:
    """Everything this bench starts; killed at the end."""

    folder: Path
    procs: list[Proc] = field(default_factory=list)

    def add(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def router(
        self,
        name: str,
        sim: Proc,
        *,
        redis_url: str | None,
        shared_cache: bool,
        rpm: int,
        burst: int,
    ) -> Proc:
        port = free_port()
        lines = [
            "[server]",
            f'listen = "127.0.0.1:{port}"',
            "[observability]",
            "access_log = false",
            'log_level = "warning"',
            "[auth]",
            "[[auth.keys]]",
            f'sha256 = "{hash_key(FAST)}"',
            'tenant = "fast"',
            "requests_per_minute = 10000000",
            "[[auth.keys]]",
            f'sha256 = "{hash_key(LIMITED)}"',
            'tenant = "limited"',
            f"requests_per_minute = {rpm}",
            f"request_burst = {burst}",
            "[limits]",
        ]
        if redis_url is not None:
            lines += ['backend = "redis"', f'redis_url = "{redis_url}"']
        lines += ["[cache]", f"enabled = {'true' if redis_url or shared_cache else 'false'}"]
        if shared_cache and redis_url is not None:
            lines.append(f'redis_url = "{redis_url}"')
        lines += [
            "[[regions]]",
            'name = "region"',
            f'base_url = "{sim.url}/v1"',
            f'models = ["{MODEL}"]',
        ]
        config = self.folder / f"router-{name}-{port}.toml"
        config.write_text("\n".join(lines) + "\n")
        args = router_cmd("serve", "--config", str(config))
        return self.add(spawn(args, port, self.folder / f"router-{name}.log", ready_timeout=60))

    def kill(self) -> None:
        for proc in self.procs:
            proc.kill()


@contextlib.contextmanager
def fleet(folder: Path) -> Iterator[Fleet]:
    f = Fleet(folder)
    try:
        yield f
    finally:
        f.kill()


# Requests.


def _body(prompt: str, *, cacheable: bool, stream: bool = False) -> bytes:
    return msgspec.json.encode(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8,
            "temperature": 0 if cacheable else 1,
            "stream": stream,
        }
    )


async def _post(
    session: aiohttp.ClientSession,
    router: Proc,
    key: str,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, float, float, str]:
    """Status, total seconds, seconds to the first body byte, x-cache."""
    began = time.perf_counter()
    h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})}
    async with session.post(router.url + "/v1/chat/completions", data=body, headers=h) as resp:
        first = None
        async for _ in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - began
        total = time.perf_counter() - began
        return resp.status, total, first or total, resp.headers.get("x-cache", "")


def _q(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def added_latency(on: Sequence[Proc], off: Proc, n: int) -> dict[str, Any]:
    """(a) Sequential misses, interleaved on (far PoPs) / off: ms per request."""
    samples: dict[str, list[float]] = {"on": [], "off": []}
    async with aiohttp.ClientSession() as session:
        for i in range(-20, n):  # 20 warm-up rounds, not counted
            for name, router in (("on", on[i % len(on)]), ("off", off)):
                body = _body(f"edge latency {name} {i} {time.time_ns()}", cacheable=True)
                status, total, _, xcache = await _post(session, router, FAST, body)
                assert status == 200, status
                assert name == "off" or xcache == "MISS", xcache
                if i >= 0:
                    samples[name].append(total * 1000)
    on_ms, off_ms = samples["on"], samples["off"]
    return {
        "requests": n,
        "on_p50_ms": statistics.median(on_ms),
        "on_p99_ms": _q(on_ms, 0.99),
        "off_p50_ms": statistics.median(off_ms),
        "off_p99_ms": _q(off_ms, 0.99),
        "added_p50_ms": statistics.median(on_ms) - statistics.median(off_ms),
        "added_p99_ms": _q(on_ms, 0.99) - _q(off_ms, 0.99),
    }


async def drive(
    pops: Sequence[Proc], rpm: int, seconds: float, events: Sequence[tuple[float, Any]] = ()
) -> list[tuple[int, float, int]]:
    """Each PoP offered `rpm` (so 3x a key limited to `rpm`), open loop, for `seconds`:
    (PoP index, seconds since start, status) per request. `events` run at their times."""
    per_s = rpm / 60
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    out: list[tuple[int, float, int]] = []

    async def one(pop: int, i: int, session: aiohttp.ClientSession) -> None:
        at = start + i / per_s + pop / (per_s * len(pops))
        await asyncio.sleep(max(0.0, at - loop.time()))
        body = _body(f"edge limited {pop} {i}", cacheable=False)
        try:
            status, _, _, _ = await _post(session, pops[pop], LIMITED, body)
        except aiohttp.ClientError:
            status = 599
        out.append((pop, at - start, status))

    async def event(at: float, action: Any) -> None:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        await loop.run_in_executor(None, action)

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        count = int(per_s * seconds)
        tasks = [one(p, i, session) for p in range(len(pops)) for i in range(count)]
        await asyncio.gather(*tasks, *(event(at, action) for at, action in events))
    return out


def limited_report(
    results: Sequence[tuple[int, float, int]], rpm: int, burst: int, seconds: float
) -> dict[str, Any]:
    """(b) Admitted vs the global limit, and each PoP's share."""
    admitted = [sum(1 for p, _, s in results if p == i and s == 200) for i in range(len(POPS))]
    expected = burst + rpm * seconds / 60
    bound = accuracy_bound(LeasePolicy(), len(POPS), burst, rpm / 60)
    fair = expected / len(POPS)
    return {
        "offered": len(results),
        "admitted": sum(admitted),
        "expected": expected,
        "ratio": sum(admitted) / expected,
        "per_pop": dict(zip(POPS, admitted, strict=True)),
        "min_share_of_fair": min(admitted) / fair,
        "bound_extra_requests": bound.extra,
        "5xx": sum(1 for _, _, s in results if s >= 500),
        "within_10pct": abs(sum(admitted) / expected - 1) <= 0.10,
        "no_pop_starved": min(admitted) >= fair / 5,
    }


def outage_report(
    results: Sequence[tuple[int, float, int]],
    rpm: int,
    burst: int,
    down_at: float,
    up_at: float,
    end: float,
) -> dict[str, Any]:
    """(c) Admitted per second before, during and after the outage."""

    def rate(lo: float, hi: float) -> float:
        return sum(1 for _, t, s in results if lo <= t < hi and s == 200) / (hi - lo)

    back = up_at + 10
    bound = accuracy_bound(LeasePolicy(), len(POPS), burst, rpm / 60)
    after = rate(back, end)
    limit = rpm / 60
    return {
        "5xx": sum(1 for _, _, s in results if s >= 500),
        "statuses": sorted({s for _, _, s in results}),
        "rate_before_per_s": rate(1, down_at),
        "rate_during_per_s": rate(down_at, up_at),
        "rate_first_10s_after_per_s": rate(up_at, back),
        "rate_from_10s_after_per_s": after,
        "limit_per_s": limit,
        # Within the bound: at most the bucket's one-time extra spread over the window, +10%.
        "back_within_bound": after <= limit * 1.1 + bound.extra / (end - back)
        and after >= limit * 0.9,
    }


async def cache_phase(pops: Sequence[Proc], prompts: int, ttft_ms: int) -> dict[str, Any]:
    """(d) Each prompt at the near PoP, then at each far one (streams): far TTFTs, x-cache."""
    headers = {"x-sim-ttft-ms": str(ttft_ms)}
    far: list[tuple[float, str]] = []
    async with aiohttp.ClientSession() as session:
        for k in range(prompts):
            body = _body(f"edge cached question {k}", cacheable=True, stream=True)
            status, _, _, _ = await _post(session, pops[0], FAST, body, headers)
            assert status == 200
        await asyncio.sleep(1.0)  # the shared tier is written in the background
        for router in pops[1:]:
            for k in range(prompts):
                body = _body(f"edge cached question {k}", cacheable=True, stream=True)
                status, _, first, xcache = await _post(session, router, FAST, body, headers)
                assert status == 200
                far.append((first * 1000, xcache))
    hits = [t for t, x in far if x == "HIT"]
    return {
        "far_requests": len(far),
        "far_hits": len(hits),
        "far_ttft_p50_ms": statistics.median(t for t, _ in far),
        "far_hit_ttft_p50_ms": statistics.median(hits) if hits else None,
    }


def sim_counts(sim: Proc) -> tuple[int, int]:
    import json
    import urllib.request

    with urllib.request.urlopen(sim.url + "/sim/stats", timeout=5) as resp:
        stats = json.loads(resp.read())
    return int(stats["requests"]), int(stats.get("cancelled", 0))


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=40.0, help="each direction")
    parser.add_argument("--requests", type=int, default=300, help="(a) per side")
    parser.add_argument("--rpm", type=int, default=600, help="(b, c) the key's global limit")
    parser.add_argument("--duration", type=float, default=20.0, help="(b) seconds (issue: 60)")
    parser.add_argument("--before-s", type=float, default=5.0, help="(c) before the outage")
    parser.add_argument("--outage-s", type=float, default=10.0, help="(c) Redis down")
    parser.add_argument("--after-s", type=float, default=20.0, help="(c) after (>= 11)")
    parser.add_argument("--prompts", type=int, default=20, help="(d) distinct prompts")
    parser.add_argument("--ttft-ms", type=int, default=300, help="(d) the region's TTFT")
    parser.add_argument("--phases", default="abcd", help="which of a, b, c, d to run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=None, help="keep process logs here")
    args = parser.parse_args(argv)
    if args.after_s < 11:
        parser.error("--after-s must be at least 11 (the rate is judged from 10 s after)")
    check_file(parser, "--json", args.json)
    if args.logs is not None:
        check_folder(parser, "--logs", args.logs)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "relay":
        parser = argparse.ArgumentParser(prog="bench.edge relay")
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--target", type=int, required=True)
        parser.add_argument("--delay-ms", type=float, required=True)
        a = parser.parse_args(argv[1:])
        uvloop.run(relay(a.port, a.target, a.delay_ms / 1000))
        return 0
    args = _args(argv)
    with contextlib.ExitStack() as stack:
        folder = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        folder.mkdir(parents=True, exist_ok=True)
        f = stack.enter_context(fleet(folder))
        report = run(f, args)
    text = msgspec.json.format(msgspec.json.encode(report)).decode()
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


def run(f: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    rpm, burst = args.rpm, max(1, args.rpm // 60)
    sim_args = router_cmd(
        "sim-region",
        "--name",
        "region",
        "--models",
        MODEL,
        "--rtt-ms",
        "0",
        "--ttft-ms",
        "0",
        "--tokens-per-s",
        "100000",
    )
    sim_port = free_port()
    sim = f.add(spawn([*sim_args, "--port", str(sim_port)], sim_port, f.folder / "sim.log"))
    redis = f.add(start_redis(f.folder))
    relay_port = free_port()
    relay_args = [
        sys.executable,
        "-m",
        "bench.edge",
        "relay",
        "--port",
        str(relay_port),
        "--target",
        str(redis.port),
        "--delay-ms",
        f"{args.delay_ms:g}",
    ]
    f.add(spawn(relay_args, relay_port, f.folder / "relay.log"))
    near_url = f"redis://127.0.0.1:{redis.port}/0"
    far_url = f"redis://127.0.0.1:{relay_port}/0"
    urls = (near_url, far_url, far_url)
    on = [
        f.router(p, sim, redis_url=u, shared_cache=True, rpm=rpm, burst=burst)
        for p, u in zip(POPS, urls, strict=True)
    ]
    off = f.router("far-off", sim, redis_url=None, shared_cache=False, rpm=rpm, burst=burst)
    local = [
        f.router(f"{p}-memory", sim, redis_url=None, shared_cache=True, rpm=rpm, burst=burst)
        for p in POPS
    ]
    report: dict[str, Any] = {"delay_ms_each_way": args.delay_ms, "rpm": rpm, "burst": burst}
    if "a" in args.phases:
        report["a_added_latency"] = uvloop.run(added_latency(on[1:], off, args.requests))
    if "b" in args.phases:
        results = uvloop.run(drive(on, rpm, args.duration))
        report["b_global_limit"] = limited_report(results, rpm, burst, args.duration)
        report["b_global_limit"]["duration_s"] = args.duration
    if "c" in args.phases:
        report["c_redis_outage"] = outage(f, args, on, redis, rpm, burst)
    if "d" in args.phases:
        report["d_cache"] = {
            name: cache_origin(sim, pops, args)
            for name, pops in (("shared_on", on), ("shared_off", local))
        }
    return report


def outage(
    f: Fleet, args: argparse.Namespace, on: Sequence[Proc], redis: Proc, rpm: int, burst: int
) -> dict[str, Any]:
    """(c) The limited drive with Redis killed and restarted (empty) on the same port."""

    # The bucket refills at rpm: start from a full one.
    time.sleep(burst / (rpm / 60) + 1)
    holder: dict[str, Proc] = {"redis": redis}

    def stop() -> None:
        holder["redis"].kill()

    def restart() -> None:
        holder["redis"] = f.add(start_redis(f.folder, port=redis.port))

    down_at, up_at = args.before_s, args.before_s + args.outage_s
    end = up_at + args.after_s
    results = uvloop.run(drive(on, rpm, end, [(down_at, stop), (up_at, restart)]))
    return outage_report(results, rpm, burst, down_at, up_at, end)


def cache_origin(sim: Proc, pops: Sequence[Proc], args: argparse.Namespace) -> dict[str, Any]:
    """(d) One cache phase and what the region counted meanwhile."""
    before = sim_counts(sim)
    result = uvloop.run(cache_phase(pops, args.prompts, args.ttft_ms))
    after = sim_counts(sim)
    result["origin_requests"] = after[0] - before[0]
    result["origin_cancelled"] = after[1] - before[1]
    result["origin_completed"] = result["origin_requests"] - result["origin_cancelled"]
    return result


if __name__ == "__main__":
    sys.exit(main())
