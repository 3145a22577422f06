"""Proxy overhead: direct-to-upstream vs a byte relay, nginx, a minimal aiohttp pass-through and
the router.

`router-core` is the router's own pipeline (core.pipeline: validation, context, the attempt
path, relay) with no feature plugged in (auth, limits, admission, rollout, cache, routing/health,
metrics and access log), to show which part of the cost is whose; `router-core-aiohttp` is the
same with aiohttp's ClientSession behind the upstream seam instead of router.net.http1, so the
lean client's gain is measured in the same run. `tcp-relay`
(bench/relay.py) copies bytes between sockets on uvloop without parsing HTTP: the floor of
what any Python hop adds on this machine. `nginx` (Debian's, one worker, keep-alive upstream
pool, no buffering; left out when not installed) is what a mature native proxy adds here.

One zero-delay simulated region, reached directly and through each hop, non-stream and
stream, at two concurrencies, each for a fixed bounded duration on loopback. Every response is
checked against the bytes the region itself returns. Prints a table of RPS, p50/p99 latency
(TTFT for streams) and the latency each hop adds over direct.

Closed-loop cells (c clients, each sending as soon as its last answer came) measure throughput;
their latencies include queueing once the CPU is saturated. The paced cells (`@ R/s`, open
loop: requests at a fixed rate, at most 32 in flight, latency counted from the scheduled send
time) measure what each hop adds to a request while the machine is not saturated.

Each cell runs every target `--rounds` times in rotating order (duration / rounds seconds each,
one keep-alive client session per target across the rounds), and pools the samples: a burst of
outside load on these shared cores then lands on all targets alike instead of on one target's
whole cell.

CPU placement (`--placement`): by default (`split`) the hop under test (tcp-relay, nginx,
pass-through, router, router-core) runs on the first CPU and the simulated region and the load
generator on the others, as in a deployment where the router has its own cores and the region
is another machine. With everything sharing the cores (`shared`), a request's write to the
region wakes the region on the proxy's own core (the kernel's wake-affine placement of the
reader of a socket), so a zero-delay region generates its whole answer there before the proxy
may relay the first chunk: stream TTFT through any hop then includes the region's CPU time,
which no remote region would cost. Direct requests are measured under the same placement
(client and region on the same CPUs).

    python -m bench.overhead                 # default: 2 s per cell plus paced cells, about 95 s
    python -m bench.overhead --rate 0        # closed-loop cells only
    python -m bench.overhead --placement shared   # every process on every CPU
    python -m bench.overhead --duration 5 --concurrency 32 128 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import uvloop
from aiohttp import web
from bench.aiohttp_transport import AiohttpTransport
from bench.outputs import check_file
from bench.procs import NGINX, nginx_cmd
from tests.support import Proc, free_port, router_cmd, spawn

from router.config import Config, load
from router.core.pipeline import Features, Pipeline
from router.core.request import CHAT
from router.core.upstream import Upstream, Upstreams
from router.server import gctune
from router.server.pools import RegionPools
from router.server.reload import LiveConfig
from router.server.run import make_runner, run_until_signal

MODEL = "sim-1"
# In-flight cap of the paced cells: the c=32, below saturation.
PACED_CAP = 32
_JSON = {"Content-Type": "application/json"}
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Measure the proxy."}]}
ROUTER_CONFIG = """\
[server]
listen = "127.0.0.1:{port}"

[auth]
enabled = false

[cache]
enabled = false

[[regions]]
name = "sim"
base_url = "http://127.0.0.1:{upstream}/v1"
models = ["{model}"]
"""


# ---- the minimal pass-through proxy the router is compared with ----


def passthrough_app(upstream: str) -> web.Application:
    """POST anything -> same path upstream; body relayed whole, or chunk by chunk if SSE."""
    app = web.Application()
    sessions: list[aiohttp.ClientSession] = []

    async def on_startup(app: web.Application) -> None:
        sessions.append(aiohttp.ClientSession(auto_decompress=False))

    async def on_cleanup(app: web.Application) -> None:
        await sessions[0].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with sessions[0].post(upstream + request.path, data=body, headers=headers) as up:
            ctype = up.headers.get("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                return web.Response(
                    status=up.status,
                    body=await up.read(),
                    content_type=None,
                    headers={"Content-Type": ctype},
                )
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/{tail:.*}", handle)
    return app


def serve_passthrough(port: int, upstream: str) -> None:
    """Run the pass-through proxy (a subprocess of the bench)."""
    web.run_app(
        passthrough_app(upstream),
        host="127.0.0.1",
        port=port,
        print=None,
        access_log=None,
        loop=uvloop.new_event_loop(),
    )


# ---- the router's core request path alone, without the features plugged into build_app ----


def core_app(config: Config, transport: str = "http1") -> web.Application:
    """The router's own pipeline with no feature plugged in: validation, context, the regions
    serving the model in config order, the attempt path, the relay. `transport` "aiohttp"
    puts aiohttp's ClientSession behind the upstream seam instead of router.net.http1."""
    app = web.Application()
    pools = RegionPools.opening(config)
    if transport == "aiohttp":
        pools = RegionPools(Upstreams(()))

        async def aiohttp_pools(app: web.Application) -> AsyncIterator[None]:
            pools.current = Upstreams(
                Upstream(
                    r,
                    AiohttpTransport(
                        r.base_url, limit=r.max_connections, keepalive_s=r.keepalive_s
                    ),
                    None,
                )
                for r in config.regions
            )
            yield
            await pools.close()

        app.cleanup_ctx.append(aiohttp_pools)
    else:
        app.cleanup_ctx.append(pools.lifetime)
    pipeline = Pipeline(Features(), LiveConfig(config), pools)
    app.router.add_post(CHAT, pipeline.handler(CHAT))
    return app


def serve_core(config_path: str, transport: str = "http1") -> None:
    """Run the core-only router (a subprocess of the bench)."""
    config = load(config_path)

    async def started() -> None:
        # The router's own GC settings, so the two differ only in their request paths.
        gctune.tune(config.server.gc_gen0_threshold)

    async def run() -> None:
        runner = make_runner(core_app(config, transport), config)
        await run_until_signal(runner, config.server.listen, extra=started)

    uvloop.run(run())


# ---- the load generator ----


@dataclass
class Cell:
    """One measured configuration."""

    target: str
    mode: str
    concurrency: int
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    # CPU time the serving process (the region for direct, else the proxy) spent per request:
    # unlike wall-clock latency it barely moves when other jobs compete for the cores.
    cpu_us: float


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(pid: int) -> float:
    """CPU of a process and its current children (a supervisor's workers), in seconds."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(p) for p in children.read_text().split()] if children.exists() else []
    total = _cpu_s(pid)
    for kid in kids:
        with contextlib.suppress(OSError):
            total += _cpu_s(kid)
    return total


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _exchange(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    stream: bool,
    start: float,
    expected: bytes,
) -> tuple[bool, float]:
    """One request: (answer equals `expected`, latency from `start` to the body or, for a
    stream, to its first chunk)."""
    try:
        async with session.post(url, data=payload, headers=_JSON) as resp:
            if stream:
                first = await resp.content.readany()
                latency = time.perf_counter() - start
                rest = await resp.read()
                return resp.status == 200 and first + rest == expected, latency
            body = await resp.read()
            return resp.status == 200 and body == expected, time.perf_counter() - start
    except aiohttp.ClientError:
        return False, 0.0


async def _load(
    session: aiohttp.ClientSession,
    url: str,
    stream: bool,
    concurrency: int,
    duration: float,
    expected: bytes,
) -> tuple[list[float], int]:
    """Closed loop: `concurrency` workers for `duration` s; latencies (s) and errors."""
    payload = json.dumps({**BODY, "stream": stream}).encode()
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            ok, latency = await _exchange(
                session, url, payload, stream, time.perf_counter(), expected
            )
            if ok:
                latencies.append(latency)
            else:
                errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors


async def _paced(
    session: aiohttp.ClientSession,
    url: str,
    stream: bool,
    rate: float,
    cap: int,
    duration: float,
    expected: bytes,
) -> tuple[list[float], int]:
    """Open loop: a request every 1/rate s, at most `cap` in flight (more count as errors).

    Latency runs from the request's scheduled time, so a stalled client or server shows up
    as latency instead of silently lowering the rate (no coordinated omission).
    """
    payload = json.dumps({**BODY, "stream": stream}).encode()
    latencies: list[float] = []
    errors = 0
    in_flight = 0

    async def one(scheduled: float) -> None:
        nonlocal errors, in_flight
        try:
            ok, latency = await _exchange(session, url, payload, stream, scheduled, expected)
        finally:
            in_flight -= 1
        if ok:
            latencies.append(latency)
        else:
            errors += 1

    began = time.perf_counter()
    tasks = []
    for i in range(max(1, int(rate * duration))):
        scheduled = began + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if in_flight >= cap:
            errors += 1
            continue
        in_flight += 1
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    return latencies, errors


async def expected_answer(url: str, stream: bool) -> bytes:
    """The region's own answer: every measured response must equal it byte for byte."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json={**BODY, "stream": stream}) as resp,
    ):
        return await resp.read()


@dataclass
class Tally:
    """One target's samples in one cell, summed over the rounds."""

    latencies: list[float]
    errors: int = 0
    elapsed: float = 0.0
    cpu: float = 0.0


async def run_cell(
    targets: dict[str, str],
    pids: dict[str, int],
    stream: bool,
    concurrency: int,
    paced: float | None,
    duration: float,
    warmup: float,
    rounds: int,
    expected: bytes,
) -> dict[str, Tally]:
    """Every target under one load, `rounds` times in rotating order, `duration / rounds` s
    each: a burst of outside load hits all targets alike instead of one target's whole cell."""
    names = list(targets)
    tallies = {name: Tally([]) for name in names}
    async with contextlib.AsyncExitStack() as stack:
        sessions = {
            name: await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))
            )
            for name in names
        }
        for name in names:
            await _load(sessions[name], targets[name], stream, concurrency, warmup, expected)
        for turn in range(rounds):
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                url, tally = targets[name], tallies[name]
                cpu_before, began = _tree_cpu_s(pids[name]), time.perf_counter()
                if paced is None:
                    latencies, errors = await _load(
                        sessions[name], url, stream, concurrency, duration / rounds, expected
                    )
                else:
                    latencies, errors = await _paced(
                        sessions[name],
                        url,
                        stream,
                        paced,
                        concurrency,
                        duration / rounds,
                        expected,
                    )
                tally.elapsed += time.perf_counter() - began
                tally.cpu += _tree_cpu_s(pids[name]) - cpu_before
                tally.latencies += latencies
                tally.errors += errors
    return tallies


async def measure(
    targets: dict[str, str],
    pids: dict[str, int],
    concurrencies: Sequence[int],
    duration: float,
    warmup: float,
    rate: float,
    rounds: int,
) -> list[Cell]:
    cells: list[Cell] = []
    # Closed loop at each concurrency (saturation: RPS), then paced below saturation (latency).
    loads: list[tuple[int, float | None]] = [(c, None) for c in concurrencies]
    if rate > 0:
        loads.append((PACED_CAP, rate))
    for base_mode in ("non-stream", "stream"):
        stream = base_mode == "stream"
        expected = await expected_answer(targets["direct"], stream)
        for concurrency, paced in loads:
            mode = base_mode if paced is None else f"{base_mode} @{paced:g}/s"
            tallies = await run_cell(
                targets, pids, stream, concurrency, paced, duration, warmup, rounds, expected
            )
            for target, t in tallies.items():
                cells.append(
                    Cell(
                        target=target,
                        mode=mode,
                        concurrency=concurrency,
                        requests=len(t.latencies),
                        errors=t.errors,
                        rps=len(t.latencies) / t.elapsed,
                        p50_ms=1000 * quantile(t.latencies, 0.5),
                        p99_ms=1000 * quantile(t.latencies, 0.99),
                        cpu_us=1e6 * t.cpu / max(1, len(t.latencies)),
                    )
                )
                print(
                    f"  {mode:10} c={concurrency:<4} {target:12} {cells[-1].rps:8.0f} rps",
                    file=sys.stderr,
                    flush=True,
                )
    return cells


def table(cells: Sequence[Cell]) -> str:
    """Markdown table; added latency is relative to direct in the same mode and concurrency.

    Paced rows also give p50 over the byte relay's: the part of the added latency that is the
    hop's own work rather than what any extra hop costs on this machine.
    """
    direct = {(c.mode, c.concurrency): c for c in cells if c.target == "direct"}
    passthrough = {(c.mode, c.concurrency): c for c in cells if c.target == "passthrough"}
    relay = {(c.mode, c.concurrency): c for c in cells if c.target == "tcp-relay"}
    lines = [
        "| mode | c | target | RPS | p50 ms | p99 ms | added p50 ms | added p99 ms "
        "| p50 over tcp-relay ms | RPS vs pass-through | CPU us/req | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        key = (c.mode, c.concurrency)
        base = direct[key]
        added = "" if c.target == "direct" else f"{c.p50_ms - base.p50_ms:+.2f}"
        added99 = "" if c.target == "direct" else f"{c.p99_ms - base.p99_ms:+.2f}"
        over = ""
        if "/s" in c.mode and key in relay and c.target not in ("direct", "tcp-relay"):
            over = f"{c.p50_ms - relay[key].p50_ms:+.2f}"
        ratio = ""
        if c.target.startswith("router") and "/s" not in c.mode and key in passthrough:
            ratio = f"{100 * c.rps / passthrough[key].rps:.0f}%"
        metric = " (TTFT)" if c.mode.startswith("stream") else ""
        lines.append(
            f"| {c.mode}{metric} | {c.concurrency} | {c.target} | {c.rps:.0f} | {c.p50_ms:.2f} "
            f"| {c.p99_ms:.2f} | {added} | {added99} | {over} | {ratio} | {c.cpu_us:.0f} "
            f"| {c.errors} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Placement:
    """The CPUs the hops under test run on, and those of the region and the load generator."""

    proxies: frozenset[int]
    rest: frozenset[int]

    def describe(self) -> str:
        return (
            f"hops under test on CPU {cpu_list(self.proxies)}; "
            f"region and load generator on CPU {cpu_list(self.rest)}"
        )


def cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def split_placement(cpus: Iterable[int]) -> Placement | None:
    """The first CPU for the hops under test, the others for the region and the load generator;
    None with fewer than two CPUs (nothing to separate)."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        return None
    return Placement(frozenset(ordered[:1]), frozenset(ordered[1:]))


def on_cpus(cmd: Sequence[str], cpus: frozenset[int] | None) -> list[str]:
    """`cmd` confined to `cpus` (every thread it starts included), or as is for None."""
    return list(cmd) if cpus is None else ["taskset", "-c", cpu_list(cpus), *cmd]


def split_here() -> Placement | None:
    """Split placement on this machine's CPUs; None without two of them or without taskset."""
    place = split_placement(os.sched_getaffinity(0))
    return place if place is not None and shutil.which("taskset") is not None else None


def start_region(tmp: Path, cpus: frozenset[int] | None) -> Proc:
    """The zero-delay simulated region every bench of proxy overhead measures against."""
    port = free_port()
    cmd = router_cmd("sim-region", "--port", str(port), "--name", "sim")
    return spawn(on_cpus(cmd, cpus), port, tmp / "sim.log")


def router_config(path: Path, upstream_port: int) -> int:
    """Write a router config (auth and cache off) in front of the region at `upstream_port` to
    `path`; the port it listens on."""
    port = free_port()
    path.write_text(ROUTER_CONFIG.format(port=port, upstream=upstream_port, model=MODEL))
    return port


def paced_options(parser: argparse.ArgumentParser, duration: float, rounds: int, of: str) -> None:
    """--rate, --duration, --rounds and --json of a paced bench that rotates its `of`."""
    parser.add_argument(
        "--rate", type=float, default=300.0, help="requests/s, at most 32 in flight"
    )
    parser.add_argument("--duration", type=float, default=duration, help=f"seconds per {of[:-1]}")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"rotations of the {of}")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")


def check_paced(parser: argparse.ArgumentParser, args: argparse.Namespace, max_rate: float) -> None:
    """Exit with a usage error unless the paced options are in bounds and --json is writable."""
    if not 0 < args.duration <= 60 or not 1 <= args.rounds <= 100 or not 0 < args.rate <= max_rate:
        parser.error(f"--duration in (0, 60], --rounds in [1, 100], --rate in (0, {max_rate:g}]")
    check_file(parser, "--json", args.json)


def _start(tmp: Path, place: Placement | None, started: dict[str, Proc]) -> None:
    """The region and every hop in front of it, under the names the table gives them; `started`
    fills as they come up, so the caller stops whatever did when one fails to."""
    hops, others = (place.proxies, place.rest) if place is not None else (None, None)
    started["direct"] = start_region(tmp, others)
    upstream_port = started["direct"].port
    port = free_port()
    started["tcp-relay"] = spawn(
        on_cpus([sys.executable, "-m", "bench.relay", str(port), str(upstream_port)], hops),
        port,
        tmp / "relay.log",
    )
    if shutil.which(NGINX) is not None:
        port = free_port()
        cmd = nginx_cmd(tmp / "nginx", port, upstream_port)
        started["nginx"] = spawn(on_cpus(cmd, hops), port, tmp / "nginx.log")
    else:
        print(f"{NGINX} not installed: no nginx row (apt-get install nginx)", file=sys.stderr)
    port = free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    started["passthrough"] = spawn(
        on_cpus(
            [sys.executable, "-m", "bench.overhead", "--serve-passthrough", str(port), upstream],
            hops,
        ),
        port,
        tmp / "passthrough.log",
    )
    config = tmp / "router.toml"
    port = router_config(config, upstream_port)
    started["router"] = spawn(
        on_cpus(router_cmd("serve", "--config", str(config)), hops), port, tmp / "router.log"
    )
    core_config = tmp / "core.toml"
    port = router_config(core_config, upstream_port)
    started["router-core"] = spawn(
        on_cpus([sys.executable, "-m", "bench.overhead", "--serve-core", str(core_config)], hops),
        port,
        tmp / "core.log",
    )
    # The same pipeline with aiohttp's client behind the upstream seam: router.net.http1's gain.
    aio_config = tmp / "core-aiohttp.toml"
    port = router_config(aio_config, upstream_port)
    started["router-core-aiohttp"] = spawn(
        on_cpus(
            [sys.executable, "-m", "bench.overhead", "--serve-core-aiohttp", str(aio_config)],
            hops,
        ),
        port,
        tmp / "core-aiohttp.log",
    )


def _start_workers(tmp: Path, counts: Sequence[int], started: dict[str, Proc]) -> None:
    """The region and `router serve --workers N` for each N, every process on every CPU."""
    started["direct"] = start_region(tmp, None)
    for n in counts:
        config = tmp / f"router-w{n}.toml"
        port = router_config(config, started["direct"].port)
        cmd = router_cmd("serve", "--config", str(config), "--workers", str(n))
        started[f"router-w{n}"] = spawn(cmd, port, tmp / f"router-w{n}.log")
        # Every worker listening before the load starts (the supervisor's children).
        deadline = time.monotonic() + 20.0
        pid = started[f"router-w{n}"].popen.pid
        kids = Path(f"/proc/{pid}/task/{pid}/children")
        while n > 1 and len(kids.read_text().split()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"router --workers {n} started fewer workers")
            time.sleep(0.05)
        time.sleep(1.0 if n > 1 else 0.0)


def scaling(cells: Sequence[Cell], counts: Sequence[int]) -> str:
    """RPS and CPU per request of each worker count relative to the first, per cell."""
    base = f"router-w{counts[0]}"
    lines = []
    for cell in cells:
        if cell.target != base:
            continue
        for n in counts[1:]:
            other = next(
                c
                for c in cells
                if c.target == f"router-w{n}"
                and c.mode == cell.mode
                and c.concurrency == cell.concurrency
            )
            lines.append(
                f"{cell.mode:22} c={cell.concurrency:<4} workers {counts[0]} -> {n}: "
                f"RPS x{other.rps / cell.rps:.2f} ({cell.rps:.0f} -> {other.rps:.0f}), "
                f"CPU/request {cell.cpu_us:.0f} -> {other.cpu_us:.0f} us"
            )
    return "\n".join(lines)


def _serving_pid(name: str, proc: Proc) -> int:
    """The process that does the work: nginx's (only) worker rather than its master."""
    pid = proc.popen.pid
    if name != "nginx":
        return pid
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + 5.0
    # The master listens before it forks its worker: give the worker a moment to appear.
    while time.monotonic() < deadline:
        workers = children.read_text().split() if children.exists() else []
        if workers:
            return int(workers[0])
        time.sleep(0.05)
    raise RuntimeError(f"nginx (pid {pid}) started no worker")


def _measure_all(
    args: argparse.Namespace, procs: dict[str, Proc], pids: dict[str, int]
) -> list[Cell]:
    """Every cell of `args` against each process's chat endpoint; `pids`: whose CPU counts."""
    path = "/v1/chat/completions"
    targets = {name: proc.url + path for name, proc in procs.items()}
    return uvloop.run(
        measure(
            targets,
            pids,
            args.concurrency,
            args.duration,
            args.warmup,
            args.rate,
            args.rounds,
        )
    )


def _report(args: argparse.Namespace, placement: str, cells: Sequence[Cell], *sections: str) -> int:
    """Print the cells (then `sections`), write --json; 1 if an answer did not match, else 0."""
    print(f"placement: {placement}")
    print(table(cells))
    for section in sections:
        print(section)
    if args.json:
        report = {"placement": placement, "cells": [asdict(c) for c in cells]}
        args.json.write_text(json.dumps(report, indent=2))
    bad = sum(c.errors for c in cells)
    if bad:
        print(f"{bad} responses did not match the region's own answer", file=sys.stderr)
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per cell")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each cell")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    parser.add_argument(
        "--rate",
        type=float,
        default=300.0,
        help="requests/s of the paced (open-loop) cells, at most 32 in flight; 0 skips them",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="each cell runs every target this many times in rotating order, duration/rounds "
        "s each, so outside load hits all targets alike",
    )
    parser.add_argument(
        "--placement",
        choices=("split", "shared"),
        default="split",
        help="split: hops under test on the first CPU, region and load generator on the others "
        "(needs 2+ CPUs and taskset); shared: every process on every CPU",
    )
    parser.add_argument("--json", type=Path, help="also write the cells as JSON here")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        metavar="N",
        help="instead of the hops: `router serve --workers N` for each N (e.g. 1 2) against the "
        "region directly, every process on every CPU, in the same run",
    )
    parser.add_argument(
        "--serve-passthrough", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS
    )
    parser.add_argument("--serve-core", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--serve-core-aiohttp", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_core:
        serve_core(args.serve_core)
        return 0
    if args.serve_core_aiohttp:
        serve_core(args.serve_core_aiohttp, "aiohttp")
        return 0
    if args.serve_passthrough:
        serve_passthrough(int(args.serve_passthrough[0]), args.serve_passthrough[1])
        return 0
    # Written so that NaN fails each bound too.
    if not 0 < args.duration <= 60:
        parser.error("--duration must be in (0, 60] seconds")
    if not 0 <= args.warmup <= 60:
        parser.error("--warmup must be in [0, 60] seconds")
    if not 0 <= args.rate <= 5000:
        parser.error("--rate must be in [0, 5000] (0 skips the paced cells)")
    if any(not 1 <= c <= 4096 for c in args.concurrency):
        parser.error("--concurrency values must be in [1, 4096]")
    if not 1 <= args.rounds <= 100:
        parser.error("--rounds must be in [1, 100]")
    check_file(parser, "--json", args.json)
    if args.workers:
        if any(not 1 <= n <= 64 for n in args.workers):
            parser.error("--workers counts must be in [1, 64]")
        return _workers_main(args)
    place = None
    if args.placement == "split":
        place = split_here()
        if place is None:
            print("split placement needs 2+ CPUs and taskset: sharing them", file=sys.stderr)
            place = None
    placement = place.describe() if place is not None else "every process on every CPU"
    print(f"placement: {placement}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="router-overhead-") as tmp:
        procs: dict[str, Proc] = {}
        try:
            _start(Path(tmp), place, procs)
            if place is not None:
                # The load generator (this process) shares the region's CPUs.
                os.sched_setaffinity(0, place.rest)
            pids = {name: _serving_pid(name, proc) for name, proc in procs.items()}
            cells = _measure_all(args, procs, pids)
        finally:
            for name, proc in procs.items():
                # nginx's master stops its worker on SIGTERM; a SIGKILL would orphan it.
                proc.kill(signal.SIGTERM if name == "nginx" else signal.SIGKILL)
    return _report(args, placement, cells)


def _workers_main(args: argparse.Namespace) -> int:
    """`--workers 1 2`: RPS and CPU per request of each worker count, one run."""
    placement = f"every process on every CPU ({len(os.sched_getaffinity(0))}), load generator too"
    print(f"placement: {placement}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="router-workers-") as tmp:
        procs: dict[str, Proc] = {}
        try:
            _start_workers(Path(tmp), args.workers, procs)
            pids = {name: proc.popen.pid for name, proc in procs.items()}
            cells = _measure_all(args, procs, pids)
        finally:
            for proc in procs.values():
                # The supervisor drains and stops its workers on SIGTERM.
                proc.kill(signal.SIGTERM)
    return _report(args, placement, cells, scaling(cells, args.workers))


if __name__ == "__main__":
    sys.exit(main())
