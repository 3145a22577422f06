"""Front-end floor: what a Python HTTP server adds to one request on this machine, before any
proxying.

Three servers give the same static JSON answer to `POST /v1/chat/completions`: a hand-rolled
HTTP/1.1 protocol on uvloop (`raw`: find the end of the head, read Content-Length bytes, write
one answer), aiohttp's low-level `web.Server` (`aiohttp-server`: its parser, request and
response objects, a task per request) and an aiohttp `web.Application` (`aiohttp-app`: URL
dispatch and one middleware on top, the shape of every aiohttp proxy). Requests are paced, as in
bench/overhead's paced cells, with the servers on the first CPU and the load generator on the
others (`--placement split`), in rotating rounds so outside load hits all alike.

The difference between `aiohttp-app` and `raw` is the framework's own share of any aiohttp
proxy's added latency; bench/overhead's `tcp-relay` row is the share of the extra hop itself.

    python -m bench.frontends                      # 300 requests/s, 6 s per server, about 20 s
    python -m bench.frontends --rate 100 --duration 5 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import uvloop
from aiohttp import web
from bench.overhead import (
    PACED_CAP,
    check_paced,
    cpu_list,
    on_cpus,
    paced_options,
    quantile,
    run_cell,
    split_here,
)
from tests.support import free_port, spawn

ANSWER = b'{"object":"static","ok":true}'
SERVERS = ("raw", "aiohttp-server", "aiohttp-app")
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


class RawHttp(asyncio.Protocol):
    """The least HTTP/1.1 a keep-alive JSON client needs: a head, Content-Length, one answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self.buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return  # the body is still on its way
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            self.transport.write(_HEAD % len(ANSWER) + ANSWER)


async def _answer(request: web.BaseRequest) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


@web.middleware
async def _passing(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    return await handler(request)


async def _serve(kind: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    if kind == "raw":
        await loop.create_server(RawHttp, "127.0.0.1", port, backlog=1024)
    else:
        runner: web.BaseRunner
        if kind == "aiohttp-server":
            runner = web.ServerRunner(web.Server(_answer, access_log=None))
        else:
            app = web.Application(middlewares=[_passing])
            app.router.add_post("/v1/chat/completions", _answer)
            runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()


@dataclass
class Row:
    """One server's pooled samples."""

    server: str
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    cpu_us: float


async def measure(
    urls: dict[str, str], pids: dict[str, int], rate: float, duration: float, rounds: int
) -> list[Row]:
    """Every server paced at `rate`, `rounds` times in rotating order, `duration / rounds` s."""
    tallies = await run_cell(urls, pids, False, PACED_CAP, rate, duration, 0.3, rounds, ANSWER)
    return [
        Row(
            server=name,
            requests=len(t.latencies),
            errors=t.errors,
            p50_ms=1000 * quantile(t.latencies, 0.5),
            p99_ms=1000 * quantile(t.latencies, 0.99),
            cpu_us=1e6 * t.cpu / max(1, len(t.latencies)),
        )
        for name, t in tallies.items()
    ]


def table(rows: Sequence[Row], rate: float) -> str:
    """Markdown table; `vs raw` is each server's p50 minus the raw protocol's."""
    raw = next(r for r in rows if r.server == "raw")
    lines = [
        f"| server (static answer, paced @{rate:g}/s) | requests | p50 ms | p99 ms | p50 vs raw ms "
        "| CPU us/req | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        versus = "" if r is raw else f"{r.p50_ms - raw.p50_ms:+.2f}"
        lines.append(
            f"| {r.server} | {r.requests} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {versus} "
            f"| {r.cpu_us:.0f} | {r.errors} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    paced_options(parser, duration=6.0, rounds=6, of="servers")
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        uvloop.run(_serve(args.serve[0], int(args.serve[1])))
        return 0
    check_paced(parser, args, max_rate=5000)
    place = split_here()
    hops = place.proxies if place is not None else None
    placement = "every process on every CPU"
    if place is not None:
        servers, others = cpu_list(place.proxies), cpu_list(place.rest)
        placement = f"servers on CPU {servers}; load generator on CPU {others}"
    with tempfile.TemporaryDirectory(prefix="router-frontends-") as tmp:
        procs = []
        try:
            for kind in SERVERS:
                port = free_port()
                cmd = [sys.executable, "-m", "bench.frontends", "--serve", kind, str(port)]
                procs.append(spawn(on_cpus(cmd, hops), port, Path(tmp) / f"{kind}.log"))
            if place is not None:
                os.sched_setaffinity(0, place.rest)
            urls = {k: p.url + "/v1/chat/completions" for k, p in zip(SERVERS, procs, strict=True)}
            pids = {k: p.popen.pid for k, p in zip(SERVERS, procs, strict=True)}
            began = time.perf_counter()
            rows = uvloop.run(measure(urls, pids, args.rate, args.duration, args.rounds))
            print(f"measured in {time.perf_counter() - began:.0f} s", file=sys.stderr)
        finally:
            for proc in procs:
                proc.kill()
    print(f"placement: {placement}")
    print(table(rows, args.rate))
    if args.json:
        report = {"placement": placement, "rate": args.rate, "rows": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(report, indent=2))
    bad = sum(r.errors for r in rows)
    if bad:
        print(f"{bad} requests failed or got another answer", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
