"""Soak: mixed load with faults for a bounded time; the router's RSS, open fds and threads must stay
flat. Not run in CI (default 10 minutes); `--minutes 1` for a quick look.

    python -m bench.soak --minutes 10 --concurrency 16 --out results/soak

Faults, on a cycle: SIGKILL of the nearest region and its restart, a region answering 503 for a
while, streams that die mid-way (x-sim-fail), and clients that hang up mid-stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from bench.outputs import check_folder
from bench.procs import Procs, interruptible, procs, sim_stats
from tests.support import Proc

MODEL = "sim-1"


@dataclass
class Tally:
    """Outcomes by kind, and the resource samples taken on the way."""

    outcomes: dict[str, int] = field(default_factory=dict)
    samples: list[dict[str, float]] = field(default_factory=list)

    def count(self, kind: str) -> None:
        self.outcomes[kind] = self.outcomes.get(kind, 0) + 1


def resources(pid: int) -> dict[str, float]:
    """RSS (bytes), open fds and threads of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kb = float(fields["VmRSS"].split()[0])
    return {
        "rss_bytes": rss_kb * 1024,
        "fds": float(len(os.listdir(f"/proc/{pid}/fd"))),
        "threads": float(fields["Threads"].strip()),
    }


async def one_request(
    session: aiohttp.ClientSession, url: str, rng: random.Random, tally: Tally
) -> None:
    """One request of the mix: stream or not, sometimes faulty, sometimes abandoned."""
    stream = rng.random() < 0.6
    headers = {"x-sim-fail": "die-mid-stream"} if stream and rng.random() < 0.05 else {}
    hang_up = stream and rng.random() < 0.05
    prompt = f"soak request {rng.randrange(200)}"
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": rng.randrange(4, 40),
        "stream": stream,
    }
    try:
        async with session.post(url, json=payload, headers=headers) as resp:
            if not stream:
                await resp.read()
                tally.count(f"http_{resp.status}")
                return
            chunks = 0
            async for _ in resp.content:
                chunks += 1
                if hang_up and chunks >= 2:
                    tally.count("client_hung_up")
                    return
            tally.count(f"stream_{resp.status}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.count(type(exc).__name__)


async def load(url: str, concurrency: int, until: float, tally: Tally, seed: int) -> None:
    """Closed-loop workers until the deadline."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def worker(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < until:
                await one_request(session, url, rng, tally)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))


async def faults(p: Procs, regions: dict[str, Proc], until: float, cycle_s: float) -> None:
    """Kill and restart the nearest region, then make another answer 503 for a while."""
    while time.monotonic() + cycle_s < until:
        await asyncio.sleep(cycle_s / 3)
        near = regions["near"]
        near.kill()
        await asyncio.sleep(cycle_s / 6)
        regions["near"] = await asyncio.to_thread(restart, p, near)
        await asyncio.sleep(cycle_s / 6)
        await asyncio.to_thread(sim_mode, regions["mid"], "503")
        await asyncio.sleep(cycle_s / 6)
        await asyncio.to_thread(sim_mode, regions["mid"], "none")


def restart(p: Procs, old: Proc) -> Proc:
    """Start a sim region again on the port it had."""
    return p.sim_region("near", rtt_ms=10, ttft_ms=20, tokens_per_s=400, port=old.port)


def sim_mode(proc: Proc, mode: str) -> None:
    """POST /sim/config fail_mode."""
    req = urllib.request.Request(
        proc.url + "/sim/config",
        data=json.dumps({"fail_mode": mode}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5):
        pass


async def sample(pid: int, until: float, every_s: float, tally: Tally) -> None:
    """Resource samples of the router process."""
    began = time.monotonic()
    while time.monotonic() < until:
        tally.samples.append({"t_s": time.monotonic() - began, **resources(pid)})
        await asyncio.sleep(every_s)


async def soak(args: argparse.Namespace) -> dict[str, object]:
    """Run the soak and return its report."""
    out = Path(args.out)
    with procs(out / "procs") as p:
        regions = {
            "near": p.sim_region("near", rtt_ms=10, ttft_ms=20, tokens_per_s=400),
            "mid": p.sim_region("mid", rtt_ms=60, ttft_ms=20, tokens_per_s=400),
            "far": p.sim_region("far", rtt_ms=150, ttft_ms=20, tokens_per_s=400),
        }
        router = p.router(
            "soak", [(n, r.url + "/v1", 0.0) for n, r in regions.items()], cache="normalized"
        )
        url = router.url + "/v1/chat/completions"
        tally = Tally()
        # Warm up, so the first sample is not the import-time RSS.
        await load(url, args.concurrency, time.monotonic() + 5, Tally(), seed=99)
        until = time.monotonic() + args.minutes * 60
        await asyncio.gather(
            load(url, args.concurrency, until, tally, seed=1),
            faults(p, regions, until, args.cycle_s),
            sample(router.popen.pid, until, args.sample_s, tally),
        )
        tally.samples.append({"t_s": args.minutes * 60, **resources(router.popen.pid)})
        origin = {n: sim_stats(r).get("requests", 0) for n, r in regions.items()}
    first, last = tally.samples[0], tally.samples[-1]
    report: dict[str, object] = {
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "outcomes": tally.outcomes,
        "origin_requests_since_restart": origin,
        "rss_first_mib": first["rss_bytes"] / 2**20,
        "rss_last_mib": last["rss_bytes"] / 2**20,
        "rss_growth_mib": (last["rss_bytes"] - first["rss_bytes"]) / 2**20,
        "fds_first": first["fds"],
        "fds_last": last["fds"],
        "threads_first": first["threads"],
        "threads_last": last["threads"],
        "samples": tally.samples,
    }
    return report


def main() -> int:
    """Parse flags, run, print a summary; Ctrl-C or SIGTERM stops every process it started."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cycle-s", type=float, default=60.0, dest="cycle_s")
    parser.add_argument("--sample-s", type=float, default=5.0, dest="sample_s")
    parser.add_argument("--out", default="results/soak")
    args = parser.parse_args()
    out = Path(args.out)
    check_folder(parser, "--out", out)
    return interruptible("soak", lambda: _run(args, out))


def _run(args: argparse.Namespace, out: Path) -> int:
    report = asyncio.run(soak(args))
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
