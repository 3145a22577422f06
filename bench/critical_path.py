"""Where one proxied request's time goes inside the router, on its critical path.

The router runs with a clock read at eight points of each request (aiohttp's read of the request
head, the app's dispatch, the write to the region and its return, the region's answer, the write
to the client and its return, aiohttp's end of the request), in front of one zero-delay simulated
region, under paced requests as in bench/overhead's paced cells (open loop, at most 32 in
flight, the hops on the first CPU and the region and load generator on the others). Two hops
are stamped in the same run, in rotating rounds: the router (`router serve`, auth and cache off,
as in bench/overhead) and `router-core` (bench/overhead's core-only router: the same request
path without the features), so the features' share of each segment shows directly, and `floor`:
the least any hop on aiohttp and the router's upstream client can do (an aiohttp app whose one
handler reads the body, posts it through `router.net.http1` and relays the answer, no checks), the
part of each segment no work in the router's own code can remove. It prints
the median and p90 of each segment, over the requests that had their hop to themselves (a
request that overlapped another is left out: its segments would include the other's work),
next to the direct and routed latency the load generator saw.

    python -m bench.critical_path                  # 300 requests/s, about 30 s
    python -m bench.critical_path --stream --json out.json
    python -m bench.critical_path --baseline ../old-checkout   # old and new, interleaved
    python -m bench.critical_path --baseline . --baseline-python python3.12   # two Pythons

The stamps cost about 1 us each.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import http_writer, web, web_app, web_protocol
from bench.overhead import (
    PACED_CAP,
    check_paced,
    expected_answer,
    on_cpus,
    paced_options,
    quantile,
    router_config,
    run_cell,
    serve_core,
    split_here,
    start_region,
)
from tests.support import Proc, spawn

from router.config import load
from router.net import http1
from router.server import gctune
from router.server.run import make_runner, run_until_signal

try:
    from router.server import dispatch
except ImportError:  # a baseline tree from before it
    dispatch = None  # type: ignore[assignment]

# (segment, what it holds), in request order; each runs from its stamp to the next one's.
SEGMENTS = (
    ("front", "aiohttp: request head parsed, request objects, handler task"),
    ("to-region", "router: dispatch, middlewares, body, validation, features, request bytes"),
    ("region-write", "write syscall to the region"),
    ("region", "the region's answer, as the router waits for it (not router work)"),
    ("from-region", "router: answer parsed, handler woken, checks, hooks, response headers"),
    ("client-write", "write syscall to the client (headers and body or first chunk)"),
    ("after", "after the first byte left: bookkeeping (streams: the rest of the stream)"),
)
HOPS = ("router", "router-core", "floor")
# The hops a `--baseline` tree is stamped for too (the floor is not the router's code).
BASE_HOPS = ("router", "router-core")
# The hop's own Python on the critical path, and the kernel's share of it.
OWN = ("front", "to-region", "from-region")
SYSCALLS = ("region-write", "client-write")
_METHODS = (b"POST ", b"GET ", b"PUT ", b"HEAD ", b"DELETE ")


class _Stamps:
    """One request at a time: the clock at each point, or the request dropped on overlap."""

    def __init__(self) -> None:
        self.open: list[int] | None = None
        self.overlapped = False
        self.done: list[list[int]] = []
        self.dropped = 0

    def begin(self) -> None:
        if self.open is not None:
            self.overlapped = True
            return
        self.open, self.overlapped = [time.perf_counter_ns()], False

    def point(self, index: int) -> None:
        # Only the first time a request reaches each point, in order.
        if self.open is not None and len(self.open) == index:
            self.open.append(time.perf_counter_ns())

    def end(self) -> None:
        if self.open is None:
            return
        if self.overlapped or len(self.open) != len(SEGMENTS):
            self.dropped += 1
        else:
            self.open.append(time.perf_counter_ns())
            self.done.append(self.open)
        self.open = None


def _instrument(stamps: _Stamps, stream: bool) -> None:
    """Wrap the eight points; each wrapper calls through unchanged. The region's answer starts
    at its first bytes, or for a stream at its first body bytes (a region may send its headers
    before it has a token)."""
    read = web_protocol.RequestHandler.data_received

    def data_received(self: web_protocol.RequestHandler, data: bytes) -> None:
        if data.startswith(_METHODS):
            stamps.begin()
        read(self, data)

    handle = web_app.Application._handle

    async def _handle(self: web_app.Application, request: Any) -> Any:
        stamps.point(1)
        return await handle(self, request)

    # The router's own dispatch of its forwarded routes (router.server.dispatch, in trees that
    # have it) replaces the app's _handle: the dispatch point is its start instead.
    install = getattr(dispatch, "install", None) if dispatch is not None else None

    def install_stamped(app: web_app.Application, *args: Any) -> None:
        assert install is not None
        install(app, *args)
        fast = app._handle

        async def stamped(request: Any) -> Any:
            stamps.point(1)
            return await fast(request)

        app._handle = stamped  # type: ignore[method-assign]

    # The end: aiohttp has sent the handler's answer (the router sends a whole one itself
    # before its bookkeeping, and so does router-core, the same pipeline).
    finish = web_protocol.RequestHandler.finish_response

    async def finish_response(self: web_protocol.RequestHandler, *args: Any) -> Any:
        try:
            return await finish(self, *args)
        finally:
            stamps.end()

    def around(fn: Callable[..., Any], before: int, after: int | None) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any) -> Any:
            stamps.point(before)
            try:
                return fn(*args)
            finally:
                if after is not None:
                    stamps.point(after)

        return wrapped

    web_protocol.RequestHandler.data_received = data_received  # type: ignore[method-assign]
    web_app.Application._handle = _handle  # type: ignore[method-assign]
    if install is not None:
        dispatch.install = install_stamped  # type: ignore[union-attr]
    web_protocol.RequestHandler.finish_response = finish_response  # type: ignore[method-assign,assignment]
    http1._Connection.send = around(http1._Connection.send, 2, 3)  # type: ignore[method-assign]
    if stream:
        http1.Body.feed = around(http1.Body.feed, 4, None)  # type: ignore[method-assign]
    else:
        conn_read = http1._Connection.data_received
        http1._Connection.data_received = around(conn_read, 4, None)  # type: ignore[method-assign]
    for name in ("_write", "_writelines"):
        write = getattr(http_writer.StreamWriter, name)
        setattr(http_writer.StreamWriter, name, around(write, 5, 6))


def floor_app(region: str, total_timeout: float | None) -> web.Application:
    """The floor: read the body, post it to `region` through net.http1, relay the answer whole
    (or chunk by chunk if SSE), with none of the router's checks, headers or bookkeeping."""
    # The exchange's total deadline, as the router's pools have it (a timer per request).
    pool = http1.Pool(
        region, limit=64, keepalive_s=60.0, connect_timeout=None, total_timeout=total_timeout
    )

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        up = await pool.post(request.path, body, [("Content-Type", "application/json")])
        ctype = up.headers.get("Content-Type", "")
        if not ctype.startswith("text/event-stream"):
            chunks = []
            while chunk := await up.content.readany():
                chunks.append(chunk)
            return web.Response(
                status=up.status, body=b"".join(chunks), headers={"Content-Type": ctype}
            )
        # The head leaves with the first chunk, in one write, as the router sends a stream.
        first = await up.content.readany()
        resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
        resp._send_headers_immediately = False
        await resp.prepare(request)
        chunk = first
        while chunk:
            await resp.write(chunk)
            chunk = await up.content.readany()
        await resp.write_eof()
        return resp

    async def close(app: web.Application) -> None:
        await pool.close()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)  # the one path the bench asks
    app.on_cleanup.append(close)
    return app


def serve_floor(config_path: str) -> None:
    """Run the floor hop on the port and in front of the region `config_path` names."""
    config = load(config_path)
    region = config.regions[0].base_url.removesuffix("/v1")

    async def started() -> None:
        gctune.tune(config.server.gc_gen0_threshold)  # the router's GC settings, as router-core

    async def run() -> None:
        runner = make_runner(floor_app(region, config.timeouts.total), config)
        await run_until_signal(runner, config.server.listen, extra=started)

    uvloop.run(run())


def serve(config: str, out: Path, stream: bool, hop: str) -> None:
    """`router serve --config CONFIG` (or the core-only router, or the floor) with stamps; at
    exit the stamps go to `out` as JSON."""
    from router.cli import main as router_main

    stamps = _Stamps()
    _instrument(stamps, stream)

    def dump() -> None:
        names = [name for name, _ in SEGMENTS]
        rows = [[b - a for a, b in itertools.pairwise(r)] for r in stamps.done]
        out.write_text(json.dumps({"segments": names, "ns": rows, "dropped": stamps.dropped}))

    atexit.register(dump)
    if hop == "router-core":
        serve_core(config)
    elif hop == "floor":
        serve_floor(config)
    else:
        router_main(["serve", "--config", config])


@dataclass
class HopReport:
    """One hop's per-segment medians and p90s (us) and its p50 as the load generator saw it."""

    requests: int
    dropped: int
    p50_us: dict[str, float]
    p90_us: dict[str, float]
    p50_ms: float


@dataclass
class Report:
    """One mode's run: the direct p50 and each stamped hop's report."""

    stream: bool
    direct_p50_ms: float
    hops: dict[str, HopReport]


def summarize(data: dict[str, Any], p50_s: float) -> HopReport:
    names: list[str] = data["segments"]
    rows: list[list[int]] = data["ns"]
    columns = {name: [row[i] / 1000 for row in rows] for i, name in enumerate(names)}
    return HopReport(
        requests=len(rows),
        dropped=data["dropped"],
        p50_us={name: quantile(v, 0.5) for name, v in columns.items()},
        p90_us={name: quantile(v, 0.9) for name, v in columns.items()},
        p50_ms=1000 * p50_s,
    )


def table(report: Report) -> str:
    """Markdown: each segment per hop (p50 / p90 us), then the hops' own and syscall shares."""
    mode = "stream (to the first chunk)" if report.stream else "non-stream"
    hops = list(report.hops.items())
    lines = [
        f"| {mode}: segment | "
        + " | ".join(f"{name} p50 / p90 us" for name, _ in hops)
        + " | what |",
        "|---|" + "---|" * len(hops) + "---|",
    ]
    for name, what in SEGMENTS:
        cells = [f"{h.p50_us[name]:.0f} / {h.p90_us[name]:.0f}" for _, h in hops]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {what} |")
    for label, parts in (("own (sum of p50s)", OWN), ("write syscalls (sum of p50s)", SYSCALLS)):
        sums = [f"{sum(h.p50_us[n] for n in parts):.0f}" for _, h in hops]
        lines.append(f"| {label} | " + " | ".join(sums) + f" | {' + '.join(parts)} |")
    seen = ", ".join(
        f"{name} {h.p50_ms:.2f} ms (added {h.p50_ms - report.direct_p50_ms:+.2f}; "
        f"{h.requests} requests stamped, {h.dropped} left out as overlapped)"
        for name, h in hops
    )
    lines.append(f"\nload generator, same run, p50: direct {report.direct_p50_ms:.2f} ms, {seen}")
    return "\n".join(lines)


async def _drive(
    urls: dict[str, str],
    pids: dict[str, int],
    stream: bool,
    rate: float,
    duration: float,
    rounds: int,
) -> dict[str, float]:
    expected = await expected_answer(urls["direct"], stream)
    tallies = await run_cell(urls, pids, stream, PACED_CAP, rate, duration, 0.5, rounds, expected)
    bad = {name: t.errors for name, t in tallies.items() if t.errors}
    if any("@" not in name for name in bad):
        raise RuntimeError(f"answers differed from the region's own: {bad}")
    if bad:
        # The baseline tree's own bugs are its own: reported, not fatal.
        print(f"baseline answers that differed from the region's own: {bad}", file=sys.stderr)
    return {name: quantile(t.latencies, 0.5) for name, t in tallies.items()}


def measure(
    stream: bool,
    rate: float,
    duration: float,
    rounds: int,
    tmp: Path,
    baseline: Path | None = None,
    baseline_python: str = sys.executable,
) -> Report:
    """Start the region and the stamped hops (and the baseline tree's, `@base`, run by
    `baseline_python`), drive them all in rotating rounds, stop the hops, read the stamps."""
    place = split_here()
    hops, others = (place.proxies, place.rest) if place is not None else (None, None)
    procs: dict[str, Proc] = {}
    names = [*HOPS, *(f"{hop}@base" for hop in BASE_HOPS if baseline is not None)]
    try:
        procs["direct"] = start_region(tmp, others)
        for name in names:
            hop, _, base = name.partition("@")
            config = tmp / f"{name}.toml"
            port = router_config(config, procs["direct"].port)
            out = tmp / f"{name}.json"
            python = baseline_python if base else sys.executable
            cmd = [python, "-m", "bench.critical_path", "--serve", str(config), str(out)]
            cmd += ["--stream"] if stream else []
            cmd += ["--core"] if hop == "router-core" else []
            cmd += ["--floor"] if hop == "floor" else []
            env, cwd = None, None
            if base and baseline is not None:
                # The other tree's router and its own bench module, in its own directory.
                env = {"PYTHONPATH": f"{baseline / 'python'}:{baseline}"}
                cwd = baseline
            procs[name] = spawn(on_cpus(cmd, hops), port, tmp / f"{name}.log", env=env, cwd=cwd)
        if others is not None:
            os.sched_setaffinity(0, others)
        path = "/v1/chat/completions"
        urls = {name: proc.url + path for name, proc in procs.items()}
        pids = {name: proc.popen.pid for name, proc in procs.items()}
        p50s = uvloop.run(_drive(urls, pids, stream, rate, duration, rounds))
        reports = {}
        for name in names:
            # SIGTERM: the hop drains and exits normally, which writes its stamps.
            procs.pop(name).kill(signal.SIGTERM)
            reports[name] = summarize(json.loads((tmp / f"{name}.json").read_text()), p50s[name])
        return Report(stream, 1000 * p50s["direct"], reports)
    finally:
        for proc in procs.values():
            proc.kill()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", action="store_true", help="stream: up to the first chunk")
    paced_options(parser, duration=10.0, rounds=4, of="targets")
    parser.add_argument("--serve", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--core", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="TREE",
        help="also stamp another checkout's router and router-core (`@base`), same run",
    )
    parser.add_argument(
        "--baseline-python",
        default=sys.executable,
        metavar="PYTHON",
        help="the interpreter of the `@base` hops (e.g. `--baseline . --baseline-python "
        "python3.12`: this tree on two Pythons)",
    )
    args = parser.parse_args(argv)
    if args.serve:
        hop = "router-core" if args.core else "floor" if args.floor else "router"
        serve(args.serve[0], Path(args.serve[1]), args.stream, hop)
        return 0
    check_paced(parser, args, max_rate=2000)
    with tempfile.TemporaryDirectory(prefix="router-critical-path-") as tmp:
        report = measure(
            args.stream,
            args.rate,
            args.duration,
            args.rounds,
            Path(tmp),
            args.baseline,
            args.baseline_python,
        )
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
