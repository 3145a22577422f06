"""Scenario "agent loop": tasks of 15 sequential calls; total task time centralized vs routed.

    python -m bench.scenarios.agent_loop --results results/agent-loop

An agent waits for each answer before its next call, so every call pays the full round trip to
the region: task time ~ calls x (RTT + TTFT + generation). Users at three PoPs run tasks against
(a) one central region directly and (b) the router at their PoP (nearest region, no cache), which
starts taking calls once its probes have measured every region. Ctrl-C or SIGTERM stops every
process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import aiohttp
import msgspec
import uvloop
from bench.outputs import check_folder
from bench.procs import interruptible, procs
from bench.scenarios.topology import POPS, Mesh, delay_method, nearest, rtt_ms, start_failure

from router.loadgen import Dist, Sample, Summary, distribution, summarize
from router.loadgen.client import send
from router.loadgen.report import markdown_table, write_results
from router.loadgen.sample import Planned

MODEL = "sim-1"


class Task(msgspec.Struct, kw_only=True):
    """One agent task: its calls, how long they took together, and whether all succeeded."""

    pop: str
    index: int
    total_s: float
    calls: list[Sample]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.calls)


class TaskRow(msgspec.Struct, kw_only=True):
    """Task-time figures of one phase (and PoP)."""

    name: str
    tasks: int
    ok: int
    calls_per_task: int
    task_ms: Dist | None


def _body(task: str, step: int, max_tokens: int) -> bytes:
    # The context grows each step, as an agent's transcript does; every call is distinct.
    messages = [{"role": "user", "content": f"task {task}: plan the work"}]
    for i in range(step):
        messages.append({"role": "assistant", "content": f"call tool {i}"})
        messages.append({"role": "user", "content": f"tool {i} returned result {task}-{i}"})
    return msgspec.json.encode(
        {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True}
    )


async def run_tasks(
    urls: Mapping[str, str],
    *,
    tasks_per_pop: int,
    parallel: int,
    calls: int,
    max_tokens: int,
    duration_s: float,
    timeout_s: float,
    phase: str,
) -> list[Task]:
    """Each PoP runs `tasks_per_pop` tasks, `parallel` at a time; no task starts after duration."""
    t0 = time.perf_counter()
    done: list[Task] = []

    async def one_task(session: aiohttp.ClientSession, pop: str, index: int) -> None:
        url = urls[pop] + "/chat/completions"
        name = f"{phase}-{pop}-{index}"
        start = time.perf_counter()
        samples: list[Sample] = []
        try:
            for step in range(calls):
                planned = Planned(url=url, body=_body(name, step, max_tokens), label=pop)
                sent_s = time.perf_counter() - t0
                try:
                    sample = await send(
                        session,
                        planned,
                        endpoint="chat",
                        stream=True,
                        timeout_s=timeout_s,
                        start_s=sent_s,
                        t0=t0,
                    )
                except asyncio.CancelledError:
                    # Cut by the hard end: the call is recorded, as router bench records it.
                    total = time.perf_counter() - t0 - sent_s
                    samples.append(
                        Sample(start_s=sent_s, total_s=total, error="unfinished", label=pop)
                    )
                    raise
                samples.append(sample)
                if not sample.ok:
                    break  # an agent cannot continue without the answer
        finally:
            # A task cut at the hard end counts too: as not ok, never silently dropped.
            task = Task(pop=pop, index=index, total_s=time.perf_counter() - start, calls=samples)
            done.append(task)

    async def pop_worker(session: aiohttp.ClientSession, pop: str, lane: int) -> None:
        for index in range(lane, tasks_per_pop, parallel):
            if time.perf_counter() - t0 >= duration_s:
                return
            await one_task(session, pop, index)

    connector = aiohttp.TCPConnector(limit=0)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        workers = [
            asyncio.create_task(pop_worker(session, pop, lane))
            for pop in POPS
            for lane in range(parallel)
        ]
        # Hard end: a task in progress gets at most `calls` timeouts more than the duration.
        _, pending = await asyncio.wait(workers, timeout=duration_s + calls * timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return sorted(done, key=lambda t: (t.pop, t.index))


def task_row(name: str, tasks: Sequence[Task], calls: int) -> TaskRow:
    """Task-time distribution over the tasks whose calls all succeeded."""
    ok = [t for t in tasks if t.ok and len(t.calls) == calls]
    return TaskRow(
        name=name,
        tasks=len(tasks),
        ok=len(ok),
        calls_per_task=calls,
        task_ms=distribution(t.total_s for t in ok),
    )


def task_table(rows: Sequence[TaskRow]) -> str:
    """Markdown: one row per phase/PoP with task-time percentiles (ms)."""
    out = [
        "| run | tasks | ok | calls/task | task p50 ms | task p95 ms | task max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r.task_ms
        cells = f"{d.p50:.0f} | {d.p95:.0f} | {d.max:.0f}" if d else "- | - | -"
        out.append(f"| {r.name} | {r.tasks} | {r.ok} | {r.calls_per_task} | {cells} |")
    return "\n".join(out) + "\n"


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.scenarios.agent_loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", type=Path, default=Path("results/agent-loop"))
    p.add_argument("--calls", type=int, default=15, help="sequential calls per task")
    p.add_argument("--tasks-per-pop", type=int, default=4)
    p.add_argument("--parallel", type=int, default=2, help="tasks at a time per PoP")
    p.add_argument("--duration", type=float, default=20.0, help="no task starts after this (s)")
    p.add_argument("--timeout", type=float, default=10.0, help="per call, seconds")
    p.add_argument("--central", choices=POPS, default="us-east")
    p.add_argument("--ttft-ms", type=float, default=60.0)
    p.add_argument("--tokens-per-s", type=float, default=500.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no per-phase lines on stderr")
    args = p.parse_args(argv)
    # Before 15 processes start: a bad option costs a line, not a run.
    if min(args.calls, args.tasks_per_pop, args.parallel, args.max_tokens) < 1:
        p.error("--calls, --tasks-per-pop, --parallel and --max-tokens must be >= 1")
    if not (0 < args.duration <= 600 and 0 < args.timeout <= 600):
        p.error("--duration and --timeout must be in (0, 600] seconds")
    if not (0 <= args.ttft_ms < math.inf and 0 < args.tokens_per_s < math.inf):
        p.error("--ttft-ms must be finite and >= 0, --tokens-per-s finite and > 0")
    check_folder(p, "--results", args.results)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run centralized then routed; write results; print both tables."""
    args = _args(argv)
    return interruptible("agent_loop", lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """The scenario for parsed, checked options."""
    method = delay_method()
    print(method, file=sys.stderr)
    per_call: list[Summary] = []
    rows: list[TaskRow] = []
    samples: dict[str, list[Sample]] = {}
    task_ms: dict[str, list[float]] = {}
    with procs(args.results / "logs") as pr:
        mesh = Mesh(pr, ttft_ms=args.ttft_ms, tokens_per_s=args.tokens_per_s, model=MODEL)
        phases: list[tuple[str, Callable[[], dict[str, str]]]] = [
            ("a-centralized", lambda: {pop: mesh.url(pop, args.central) for pop in POPS}),
            ("b-routed", lambda: mesh.routers(pr, None)),
        ]
        for name, urls_of in phases:
            try:
                urls = urls_of()
            except RuntimeError as exc:
                print(f"{name}: skipped: {start_failure(exc)}", file=sys.stderr)
                rows.append(
                    TaskRow(
                        name=f"{name} (skipped)",
                        tasks=0,
                        ok=0,
                        calls_per_task=args.calls,
                        task_ms=None,
                    )
                )
                continue
            if not args.quiet:
                print(f"{name}: running tasks", file=sys.stderr)
            wall0 = time.perf_counter()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                tasks = runner.run(
                    run_tasks(
                        urls,
                        tasks_per_pop=args.tasks_per_pop,
                        parallel=args.parallel,
                        calls=args.calls,
                        max_tokens=args.max_tokens,
                        duration_s=args.duration,
                        timeout_s=args.timeout,
                        phase=name,
                    )
                )
            wall = time.perf_counter() - wall0
            calls = [c for t in tasks for c in t.calls]
            samples[name] = calls
            call_summary = summarize(f"{name} (calls)", calls, wall)
            if name.startswith("b-"):
                # Which region served each PoP's calls (x-router-region): a check that every
                # call went to the nearest region (the routers take none before probing all).
                served = {
                    pop: summarize(pop, [c for c in calls if c.label == pop], wall).regions
                    for pop in POPS
                }
                call_summary.notes.append(f"regions per PoP: {served}")
            per_call.append(call_summary)
            rows.append(task_row(name, tasks, args.calls))
            rows += [
                task_row(f"{name} @{pop}", [t for t in tasks if t.pop == pop], args.calls)
                for pop in POPS
            ]
            task_ms[name] = [t.total_s * 1000 for t in tasks if t.ok]
    tps: float = args.tokens_per_s
    gen_ms = (args.max_tokens - 1) / tps * 1000 if tps > 0 else 0.0
    per_call_ms: float = args.ttft_ms + gen_ms
    n_calls: int = args.calls

    def model_ms(pop: str, region: str) -> float:
        return n_calls * (rtt_ms(pop, region) + per_call_ms)

    notes = "\n".join(
        f"- RTT model @{pop}: centralized {model_ms(pop, args.central):.0f} ms, routed "
        f"{model_ms(pop, nearest(pop)):.0f} ms ({args.calls} x (RTT + {args.ttft_ms:g} ms TTFT "
        f"+ {gen_ms:.0f} ms generation))"
        for pop in POPS
    )
    text = task_table(rows) + "\n" + notes + "\n\n" + markdown_table(per_call)
    print(text)
    write_results(
        args.results, per_call, title="agent loop", samples=samples, plots=not args.no_plot
    )
    (args.results / "tasks.json").write_bytes(msgspec.json.encode(rows))
    (args.results / "results.md").write_text("# agent loop\n\n" + method + "\n\n" + text)
    if not args.no_plot:
        from router.loadgen.plot import latency_cdf

        latency_cdf(
            args.results / "task-cdf.png",
            "agent loop: task time",
            task_ms,
            "task time (ms)",
            "fraction of tasks",
        )
    print(f"results in {args.results}", file=sys.stderr)
    ran = [r for r in rows if "@" not in r.name]
    return 0 if ran and all(0 < r.ok == r.tasks for r in ran) else 1


if __name__ == "__main__":
    raise SystemExit(main())
