"""Scenario "overhead": the same upstream direct, through the router, and through nginx.

    python -m bench.scenarios.overhead_nginx --results results/overhead

One sim region with no injected RTT; Debian's nginx (/usr/sbin/nginx) as a plain streaming
reverse proxy (keep-alive upstream pool, no buffering); the router with cache and auth off.
The same closed-loop load goes to each in turn (rounds interleave them to spread drift).
Ctrl-C or SIGTERM stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import uvloop
from bench.outputs import check_folder
from bench.procs import interruptible, procs
from bench.scenarios.topology import start_failure

from router.loadgen import LoadSpec, Sample, Summary, run_load, summarize
from router.loadgen.progress import Progress
from router.loadgen.report import markdown_table, write_results
from router.loadgen.requests import endpoint_url, round_robin

MODEL = "sim-1"


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.scenarios.overhead_nginx",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", type=Path, default=Path("results/overhead"))
    # One request at a time by default: the added latency without queueing in front of a
    # saturated 2-core machine; raise it to compare throughput.
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--count", type=int, default=400, help="requests per target and round")
    p.add_argument("--duration", type=float, default=5.0, help="cap per target and round (s)")
    p.add_argument("--rounds", type=int, default=3, help="direct/nginx/router, interleaved")
    p.add_argument("--ttft-ms", type=float, default=0.0, help="the upstream's own TTFT")
    p.add_argument("--tokens-per-s", type=float, default=0.0, help="0: as fast as it can")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if min(args.concurrency, args.count, args.rounds, args.max_tokens) < 1:
        p.error("--concurrency, --count, --rounds and --max-tokens must be >= 1")
    if not 0 < args.duration <= 600:
        p.error("--duration must be in (0, 600] seconds")
    if not (0 <= args.ttft_ms < math.inf and 0 <= args.tokens_per_s < math.inf):
        p.error("--ttft-ms and --tokens-per-s must be finite and >= 0")
    check_folder(p, "--results", args.results)
    return args


def overhead_notes(rows: Sequence[Summary]) -> list[str]:
    """Each proxy's added TTFT/total latency over direct, at p50 and p99."""
    by = {r.name: r for r in rows}
    direct = by.get("direct")
    notes: list[str] = []
    if direct is None or direct.total_ms is None:
        return notes
    for name in ("nginx", "router"):
        r = by.get(name)
        if r is None or r.total_ms is None:
            continue
        parts = [
            f"total {r.total_ms.p50 - direct.total_ms.p50:+.2f} ms p50, "
            f"{r.total_ms.p99 - direct.total_ms.p99:+.2f} ms p99"
        ]
        if r.ttft_ms is not None and direct.ttft_ms is not None:
            parts.insert(
                0,
                f"TTFT {r.ttft_ms.p50 - direct.ttft_ms.p50:+.2f} ms p50, "
                f"{r.ttft_ms.p99 - direct.ttft_ms.p99:+.2f} ms p99",
            )
        parts.append(f"throughput {r.ok_rps / direct.ok_rps:.0%} of direct")
        notes.append(f"- {name} over direct: " + "; ".join(parts))
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    """Start upstream, nginx and router; load each in turn; write and print the comparison."""
    args = _args(argv)
    return interruptible("overhead_nginx", lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """The scenario for parsed, checked options."""
    stream = not args.no_stream
    spec = LoadSpec(
        concurrency=args.concurrency,
        duration_s=args.duration,
        max_requests=args.count,
        grace_s=5.0,
        stream=stream,
    )
    runs: dict[str, list[Sample]] = {}
    walls: dict[str, float] = {}
    with procs(args.results / "logs") as pr:
        sim = pr.sim_region(
            "origin", rtt_ms=0.0, ttft_ms=args.ttft_ms, tokens_per_s=args.tokens_per_s, model=MODEL
        )
        targets: dict[str, str] = {"direct": sim.url}
        starters: list[tuple[str, Callable[[], str]]] = [
            ("nginx", lambda: pr.nginx(sim.port).url),
            (
                "router",
                lambda: pr.router("overhead", [("origin", sim.url + "/v1", 0.0)], model=MODEL).url,
            ),
        ]
        for name, start in starters:
            try:
                targets[name] = start()
            except RuntimeError as exc:
                print(f"{name}: skipped, did not start: {start_failure(exc)}", file=sys.stderr)
        for rnd in range(args.rounds):
            for name, base in targets.items():
                factory = round_robin(
                    endpoint_url(base, "chat"),
                    ["Measure the proxy."],
                    model=MODEL,
                    endpoint="chat",
                    max_tokens=args.max_tokens,
                    stream=stream,
                )
                label = name if args.rounds == 1 else f"{name}#{rnd + 1}"
                progress = None if args.quiet else Progress(label, 2.0)
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    result = runner.run(run_load(label, spec, factory, progress=progress))
                runs.setdefault(name, []).extend(result.samples)
                walls[name] = walls.get(name, 0.0) + result.wall_s
    rows = [
        summarize(
            name, samples, walls[name], config={"concurrency": args.concurrency, "stream": stream}
        )
        for name, samples in runs.items()
    ]
    notes = overhead_notes(rows)
    missing = [n for n in ("direct", "nginx", "router") if n not in runs]
    if missing:
        notes.append(f"- not measured (did not start): {', '.join(missing)}")
    text = markdown_table(rows) + "\n" + "\n".join(notes) + "\n"
    print(text)
    write_results(
        args.results,
        rows,
        title="overhead: direct vs nginx vs router",
        samples=runs,
        plots=not args.no_plot,
    )
    (args.results / "results.md").write_text("# overhead: direct vs nginx vs router\n\n" + text)
    print(f"results in {args.results}", file=sys.stderr)
    return 0 if not missing and all(r.ok == r.sent for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
