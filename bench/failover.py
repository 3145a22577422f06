"""Failover under load: three sim regions, fixed open-loop stream load, SIGKILL the nearest.

    python -m bench.failover [--rate 30] [--seconds 15] [--kill-at 5] [--interval 0.5]
                             [--midstream error|resume]

Prints requests lost before the first byte (target 0), streams broken mid-way, time until the
killed region is out of rotation and until traffic is rerouted (target < 2 probe intervals),
p99 TTFT before / during / after, and each region's share of traffic per second. Every request
is checked against the simulated region's deterministic text.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from tests.support import Proc, free_port, router_cmd, spawn

from router.sim import text

MODEL = "sim-1"
ADMIN = "bench-admin-token"


@dataclass
class Result:
    """One request as the client saw it."""

    sent: float
    status: int
    region: str | None
    failovers: int
    ttft_s: float | None
    outcome: str  # "ok" | "lost" (nothing streamed) | "broken" (error after tokens) | "wrong"


def sim(folder: Path, name: str, rtt_ms: float) -> Proc:
    port = free_port()
    args = router_cmd(
        "sim-region",
        "--port",
        str(port),
        "--name",
        name,
        "--rtt-ms",
        f"{rtt_ms:g}",
        "--ttft-ms",
        "20",
        "--tokens-per-s",
        "200",
    )
    return spawn(args, port, folder / f"sim-{name}.log")


def router(folder: Path, regions: list[tuple[str, Proc]], interval: float, midstream: str) -> Proc:
    port = free_port()
    lines = [
        "[server]",
        f'listen = "127.0.0.1:{port}"',
        "[timeouts]",
        "connect = 0.5",
        "first_byte = 5.0",
        "idle = 2.0",
        "[health]",
        f"interval_s = {interval}",
        f"timeout_s = {min(interval, 0.5)}",
        "[routing]",
        f'midstream = "{midstream}"',
        "[cache]",
        "enabled = false",
        "[auth]",
        "enabled = false",
        f'admin_token_sha256 = "{hashlib.sha256(ADMIN.encode()).hexdigest()}"',
        "[observability]",
        "access_log = false",
    ]
    for name, proc in regions:
        lines += [
            "[[regions]]",
            f'name = "{name}"',
            f'base_url = "{proc.url}/v1"',
            f'models = ["{MODEL}"]',
            'kind = "sim"',
        ]
    path = folder / "router.toml"
    path.write_text("\n".join(lines) + "\n")
    return spawn(router_cmd("serve", "--config", str(path)), port, folder / "router.log")


async def one(session: aiohttp.ClientSession, url: str, i: int, t0: float) -> Result:
    msgs = [{"role": "user", "content": f"bench request {i}"}]
    expected = text.full_chat_text(MODEL, msgs)
    body = {"model": MODEL, "messages": msgs, "stream": True}
    sent = time.monotonic()
    ttft = None
    pieces: list[str] = []
    done = error = False
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            region = resp.headers.get("x-router-region")
            failovers = int(resp.headers.get("x-router-failovers", "0"))
            if resp.status != 200:
                await resp.read()
                return Result(sent - t0, resp.status, region, failovers, None, "lost")
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    data = ev.decode().removeprefix("data: ")
                    if data == "[DONE]":
                        done = True
                        continue
                    obj = json.loads(data)
                    if "error" in obj:
                        error = True
                        continue
                    for c in obj.get("choices", []):
                        piece = c.get("delta", {}).get("content")
                        if piece:
                            if ttft is None:
                                ttft = time.monotonic() - sent
                            pieces.append(piece)
    except aiohttp.ClientError:
        return Result(sent - t0, 0, None, 0, ttft, "lost" if not pieces else "broken")
    got = "".join(pieces)
    if done and not error and got == expected:
        outcome = "ok"
    elif error and not pieces:
        outcome = "lost"
    elif error and expected.startswith(got):
        outcome = "broken"
    else:
        outcome = "wrong"
    return Result(sent - t0, 200, region, failovers, ttft, outcome)


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(0.99 * len(v)))]


async def drive(url: str, rate: float, seconds: float, kill_at: float, victim: Proc) -> list[Any]:
    """Open loop: one request every 1/rate s for `seconds`; SIGKILL `victim` at kill_at."""
    results: list[Result] = []
    tasks: list[asyncio.Task[None]] = []
    t0 = time.monotonic()
    killed_at: float | None = None
    watch: asyncio.Task[tuple[float, float]] | None = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:

        async def run(i: int) -> None:
            results.append(await one(session, url, i, t0))

        n = int(rate * seconds)
        for i in range(n):
            due = t0 + i / rate
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            if killed_at is None and time.monotonic() - t0 >= kill_at:
                await asyncio.to_thread(victim.kill)
                killed_at = time.monotonic() - t0
                watch = asyncio.create_task(asyncio.to_thread(time_to_flag, url, "a"))
            tasks.append(asyncio.create_task(run(i)))
        await asyncio.gather(*tasks)
    assert watch is not None, "--kill-at must fall inside --seconds"
    return [results, killed_at, await watch]


def time_to_flag(url: str, name: str, limit_s: float = 10.0) -> tuple[float, float]:
    """Seconds until the router has region `name` out of rotation, and until probes call it down."""
    began = time.monotonic()
    out_at = down_at = None
    while time.monotonic() - began < limit_s and (out_at is None or down_at is None):
        for h in health(url):
            if h["name"] == name:
                now = time.monotonic() - began
                if out_at is None and not h["available"]:
                    out_at = now
                if down_at is None and not h["healthy"]:
                    down_at = now
        time.sleep(0.02)
    return (out_at or float("nan"), down_at or float("nan"))


def health(url: str) -> list[dict[str, Any]]:
    """GET /admin/health: the router's view of every region."""
    req = urllib.request.Request(
        url + "/admin/health", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        regions: list[dict[str, Any]] = json.loads(resp.read())["regions"]
    return regions


def report(
    results: list[Result],
    killed_at: float,
    flagged: tuple[float, float],
    interval: float,
    seconds: float,
) -> None:
    results.sort(key=lambda r: r.sent)
    lost = [r for r in results if r.outcome == "lost"]
    broken = [r for r in results if r.outcome == "broken"]
    wrong = [r for r in results if r.outcome == "wrong"]
    after = [r for r in results if r.sent >= killed_at]
    # Rerouted: from here on no request was served by, or failed over from, the dead region.
    last_bad = max((r.sent for r in after if r.region == "a" or r.failovers), default=killed_at)
    reroute = last_bad - killed_at
    window = max(2 * interval, 1.0)
    before = [r.ttft_s for r in results if r.sent < killed_at and r.ttft_s is not None]
    during = [r.ttft_s for r in after if r.sent < killed_at + window and r.ttft_s is not None]
    later = [r.ttft_s for r in after if r.sent >= killed_at + window and r.ttft_s is not None]
    print(
        f"requests: {len(results)}  killed region a at t={killed_at:.2f}s  "
        f"probe interval {interval}s"
    )
    print(
        f"lost before first byte: {len(lost)}   broken mid-stream: {len(broken)}   "
        f"wrong text: {len(wrong)}   failed over: {sum(1 for r in results if r.failovers)}"
    )
    print(f"time to reroute: {reroute:.3f}s ({reroute / interval:.2f} probe intervals)")
    print(
        f"out of rotation after {flagged[0]:.3f}s; probes marked it down after "
        f"{flagged[1]:.3f}s ({flagged[1] / interval:.2f} probe intervals)"
    )
    print(
        f"p99 TTFT ms: before {p99(before) * 1000:.1f}   during (first {window:.1f}s) "
        f"{p99(during) * 1000:.1f}   after {p99(later) * 1000:.1f}"
    )
    print()
    print("second | requests |   a%  |   b%  |   c%")
    for s in range(int(seconds)):
        bucket = [r for r in results if s <= r.sent < s + 1 and r.region]
        n = len(bucket) or 1
        share = {k: 100 * sum(1 for r in bucket if r.region == k) / n for k in "abc"}
        mark = "  <- kill" if s <= killed_at < s + 1 else ""
        print(
            f"{s:6d} | {len(bucket):8d} | {share['a']:5.1f} | {share['b']:5.1f} | "
            f"{share['c']:5.1f}{mark}"
        )
    if wrong:
        print(f"WRONG TEXT in {len(wrong)} responses", file=sys.stderr)
        sys.exit(1)


def print_health(url: str) -> None:
    """The router's view of each region at the end (GET /admin/health)."""
    regions = health(url)
    print()
    print("region | available | ejections | ewma rtt ms | ewma ttft ms | last error")
    for h in regions:
        print(
            f"{h['name']:6} | {h['available']!s:9} | {h['ejections']:9d} | "
            f"{h['ewma_rtt_ms'] or 0:11.1f} | {h['ewma_ttft_ms'] or 0:12.1f} | {h['last_error']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=30.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--kill-at", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=0.5, help="[health] interval_s")
    parser.add_argument("--midstream", choices=("error", "resume"), default="error")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        folder = Path(tmp)
        procs = [sim(folder, "a", 5), sim(folder, "b", 25), sim(folder, "c", 50)]
        r = router(folder, list(zip("abc", procs, strict=True)), args.interval, args.midstream)
        try:
            time.sleep(3 * args.interval)  # a few probe rounds so RTTs are measured
            with urllib.request.urlopen(r.url + "/readyz", timeout=5) as resp:
                assert resp.status == 200
            results, killed_at, flagged = asyncio.run(
                drive(r.url, args.rate, args.seconds, args.kill_at, procs[0])
            )
            report(results, killed_at, flagged, args.interval, args.seconds)
            print_health(r.url)
        finally:
            for p in (r, *procs):
                p.kill()


if __name__ == "__main__":
    main()
