"""How often, and for how long, the cycle collector stops the router under load.

Each hop (`router serve`, auth and cache off as in bench/overhead, and with --baseline the same
of another checkout) runs under bench/_gc_hop.py, which times every collector pass after
startup (gc.callbacks), in front of one zero-delay simulated region. The hops take closed-loop
load in rotating rounds (bench/overhead's run_cell: a burst of outside load hits both alike);
then each hop's passes, their total and longest pause, the objects they found (only reference
cycles reach the collector: a request path that leaves none leaves it nothing) and the
latency quantiles the load generator saw are printed. A pass stops every request in flight,
so its pause lands in the tail.

    python -m bench.gc_pauses                           # 16 in flight, 20 s per hop
    python -m bench.gc_pauses --stream --baseline ../old-checkout --json out.json
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import uvloop
from bench.outputs import check_file
from bench.overhead import (
    Tally,
    expected_answer,
    quantile,
    router_config,
    run_cell,
    start_region,
)
from tests.support import Proc, spawn

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass
class HopPauses:
    """One hop's requests, latency and collector passes over the measured load."""

    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    passes: int
    pause_ms: float
    longest_ms: float
    collected: int


def summarize(
    requests: int, errors: int, latencies: list[float], passes: list[list[float]]
) -> HopPauses:
    """A hop's figures from its load tally and its passes ((generation, s, collected) each)."""
    pauses = [p[1] for p in passes]
    return HopPauses(
        requests=requests,
        errors=errors,
        p50_ms=quantile(latencies, 0.5) * 1e3 if latencies else 0.0,
        p99_ms=quantile(latencies, 0.99) * 1e3 if latencies else 0.0,
        passes=len(passes),
        pause_ms=sum(pauses) * 1e3,
        longest_ms=max(pauses, default=0.0) * 1e3,
        collected=int(sum(p[2] for p in passes)),
    )


def table(hops: dict[str, HopPauses], stream: bool) -> str:
    """Markdown: one row per hop."""
    mode = "stream" if stream else "non-stream"
    lines = [
        f"| {mode} | requests | p50 / p99 ms | collector passes | pause ms (total / longest) "
        "| objects collected |",
        "|---|---|---|---|---|---|",
    ]
    for name, h in hops.items():
        lines.append(
            f"| {name} | {h.requests} ({h.errors} errors) | {h.p50_ms:.2f} / {h.p99_ms:.2f} "
            f"| {h.passes} | {h.pause_ms:.1f} / {h.longest_ms:.1f} | {h.collected} |"
        )
    return "\n".join(lines)


def _passes(proc: Proc, out: Path, what: str) -> list[list[float]]:
    """The hop's passes so far (it writes them on SIGUSR1)."""
    out.unlink(missing_ok=True)
    proc.popen.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: no passes written")
        time.sleep(0.05)
    time.sleep(0.05)  # written in one call; let it land whole
    passes: list[list[float]] = json.loads(out.read_text())["passes"]
    return passes


def measure(
    stream: bool, concurrency: int, duration: float, rounds: int, tmp: Path, baseline: Path | None
) -> dict[str, HopPauses]:
    """Every hop under the same rotating load; each one's passes during it."""
    trees = {"router": REPO, **({"router@base": baseline} if baseline is not None else {})}
    procs: dict[str, Proc] = {}
    try:
        procs["region"] = start_region(tmp, None)
        for name, tree in trees.items():
            config = tmp / f"{name}.toml"
            port = router_config(config, procs["region"].port)
            cmd = [sys.executable, str(HERE / "_gc_hop.py"), str(tmp / f"{name}.json"), "--"]
            cmd += ["router", "serve", "--config", str(config)]
            env = {"PYTHONPATH": f"{tree / 'python'}:{tree}"}
            procs[name] = spawn(cmd, port, tmp / f"{name}.log", env=env, cwd=tree)
        targets = {name: f"{procs[name].url}/v1/chat/completions" for name in trees}
        pids = {name: procs[name].popen.pid for name in trees}
        region_url = f"{procs['region'].url}/v1/chat/completions"

        async def load() -> dict[str, Tally]:
            expected = await expected_answer(region_url, stream)
            # Warm-up first (run_cell's), then the passes that count start from here.
            return await run_cell(
                targets, pids, stream, concurrency, None, duration, 2.0, rounds, expected
            )

        before = {name: len(_passes(procs[name], tmp / f"{name}.json", name)) for name in trees}
        tallies = uvloop.run(load())
        hops = {}
        for name in trees:
            passes = _passes(procs[name], tmp / f"{name}.json", name)[before[name] :]
            tally = tallies[name]
            hops[name] = summarize(len(tally.latencies), tally.errors, tally.latencies, passes)
        return hops
    finally:
        for proc in procs.values():
            proc.kill()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", action="store_true", help="streamed chat requests")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per hop")
    parser.add_argument("--rounds", type=int, default=4, help="rotations of the hops")
    parser.add_argument(
        "--baseline", type=Path, metavar="TREE", help="also time another checkout's hop"
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if (
        not 1 <= args.concurrency <= 256
        or not 0 < args.duration <= 300
        or not 1 <= args.rounds <= 100
    ):
        parser.error("--concurrency in [1, 256], --duration in (0, 300], --rounds in [1, 100]")
    check_file(parser, "--json", args.json)
    baseline = args.baseline.resolve() if args.baseline is not None else None
    with tempfile.TemporaryDirectory(prefix="router-gc-") as tmp:
        hops = measure(
            args.stream, args.concurrency, args.duration, args.rounds, Path(tmp), baseline
        )
    print(table(hops, args.stream))
    if args.json:
        args.json.write_text(json.dumps({k: asdict(v) for k, v in hops.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
