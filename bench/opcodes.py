"""How much Python one proxied request runs in the router, counted instead of timed.

Each hop (the router, `router serve` with auth and cache off as in bench/overhead, and
`router-core`, the same pipeline without features) runs under bench/_opcode_hop.py in front of
one zero-delay simulated region; after warm-up requests, the bytecodes each of the next requests
executes (sys.settrace opcode events) are counted, from its first bytes to its first write to the
client (`critical`, what bench/critical_path times) and to the end of its handling (`whole`),
and printed per request and per module. Requests are sent one at a time, so nothing else runs
in between. The counts barely move from run to run, so a cut a few percent deep shows here
where the timed benches' noise (about +-15 us between runs) hides it; they count Python only
(C, Rust and the kernel are free here: a loop moved into C calls counts less and may run
slower, so time such a cut too) and tracing makes the hop about ten times slower.

    python -m bench.opcodes                          # 200 requests after 30 warm-up ones
    python -m bench.opcodes --stream --baseline ../old-checkout --json out.json
    python -m bench.opcodes --by function --top 40
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import uvloop
from bench.outputs import check_file
from bench.overhead import BODY, router_config, start_region
from tests.support import Proc, spawn

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HOPS = ("router", "router-core")
PHASES = ("critical", "whole")


def module_of(filename: str) -> str:
    """A code object's file as a module path: `router/core/pipeline.py`, `aiohttp/web.py`,
    `asyncio/tasks.py` (site-packages, a checkout's python/ and the stdlib folder dropped)."""
    for marker in ("/site-packages/", "/python/", "/lib/python3."):
        if marker in filename:
            tail = filename.rsplit(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." else tail
    return filename


@dataclass
class HopCounts:
    """One hop's bytecodes per request: in all, and per module (both phases)."""

    requests: int
    total: dict[str, float]
    modules: dict[str, dict[str, float]]
    # Per function, `module:name` (every code object of that name in the module together).
    functions: dict[str, dict[str, float]]


def summarize(data: dict[str, object]) -> HopCounts:
    """Per-request totals and per-module counts from a hop's raw counts."""
    n = int(data["requests"])  # type: ignore[call-overload]
    total: dict[str, float] = {}
    modules: dict[str, dict[str, float]] = {}
    functions: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        per: Counter[str] = Counter()
        per_function: Counter[str] = Counter()
        for filename, name, count in data[phase]:  # type: ignore[attr-defined]
            per[module_of(filename)] += count
            per_function[f"{module_of(filename)}:{name}"] += count
        total[phase] = sum(per.values()) / n
        modules[phase] = {m: c / n for m, c in per.most_common()}
        functions[phase] = {f: c / n for f, c in per_function.most_common()}
    return HopCounts(n, total, modules, functions)


def table(counts: dict[str, HopCounts], stream: bool, top: int, by: str = "module") -> str:
    """Markdown: per-request totals of each hop, then the modules (or functions, `by`) that run
    the most on the critical path."""
    names = list(counts)
    mode = "stream" if stream else "non-stream"
    lines = [
        f"| {mode}: bytecodes per request | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for phase in PHASES:
        cells = [f"{counts[name].total[phase]:,.0f}" for name in names]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    rows = {name: getattr(counts[name], f"{by}s")["critical"] for name in names}
    lines += ["", f"| {by} (critical) | " + " | ".join(names) + " |"]
    lines.append("|---|" + "---|" * len(names))
    for key in list(rows[names[0]])[:top]:
        cells = [f"{rows[name].get(key, 0):,.0f}" for name in names]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def _drive(url: str, stream: bool, requests: int) -> None:
    """`requests` requests one at a time, each read whole."""
    payload = json.dumps({**BODY, "stream": stream}).encode()
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        for _ in range(requests):
            async with session.post(url, data=payload, headers=headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url}: HTTP {resp.status}: {body[:200]!r}")


def _wait_for(out: Path, what: str) -> None:
    """Until the hop wrote its counts (it does once the last counted request ended)."""
    deadline = time.monotonic() + 10
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: no counts written")
        time.sleep(0.05)


def measure(
    stream: bool, warmup: int, requests: int, tmp: Path, baseline: Path | None
) -> dict[str, HopCounts]:
    """Count each hop (and the baseline tree's, `@base`), one after another."""
    names = [*HOPS, *(f"{hop}@base" for hop in HOPS if baseline is not None)]
    procs: dict[str, Proc] = {}
    counts: dict[str, HopCounts] = {}
    try:
        procs["region"] = start_region(tmp, None)
        for name in names:
            hop, _, base = name.partition("@")
            tree = baseline if base and baseline is not None else REPO
            config = tmp / f"{name}.toml"
            port = router_config(config, procs["region"].port)
            out = tmp / f"{name}.json"
            run = ["router", "serve", "--config", str(config)]
            if hop == "router-core":
                run = ["bench.overhead", "--serve-core", str(config)]
            cmd = [sys.executable, str(HERE / "_opcode_hop.py"), str(out), str(warmup)]
            cmd += [str(requests), "--", *run]
            env = {"PYTHONPATH": f"{tree / 'python'}:{tree}"}
            procs[name] = spawn(cmd, port, tmp / f"{name}.log", env=env, cwd=tree)
            url = f"{procs[name].url}/v1/chat/completions"
            uvloop.run(_drive(url, stream, warmup + requests))
            _wait_for(out, name)
            procs.pop(name).kill(signal.SIGTERM)
            counts[name] = summarize(json.loads(out.read_text()))
    finally:
        for proc in procs.values():
            proc.kill()
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", action="store_true", help="streamed chat requests")
    parser.add_argument("--requests", type=int, default=200, help="requests counted per hop")
    parser.add_argument("--warmup", type=int, default=30, help="requests before counting")
    parser.add_argument("--top", type=int, default=25, help="modules (or functions) listed")
    parser.add_argument(
        "--by", choices=("module", "function"), default="module", help="what the rows count"
    )
    parser.add_argument(
        "--baseline", type=Path, metavar="TREE", help="also count another checkout's hops"
    )
    parser.add_argument("--json", type=Path, help="also write the counts as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= 5000 or not 0 <= args.warmup <= 1000:
        parser.error("--requests in [1, 5000], --warmup in [0, 1000]")
    check_file(parser, "--json", args.json)
    baseline = args.baseline.resolve() if args.baseline is not None else None
    with tempfile.TemporaryDirectory(prefix="router-opcodes-") as tmp:
        counts = measure(args.stream, args.warmup, args.requests, Path(tmp), baseline)
    print(table(counts, args.stream, args.top, args.by))
    if args.json:
        args.json.write_text(json.dumps({k: asdict(v) for k, v in counts.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
