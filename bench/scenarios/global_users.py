"""Scenario "global users": users at three PoPs; centralized vs nearest routing vs routing + cache.

    python -m bench.scenarios.global_users --results results/global-users

(a) centralized: every user talks straight to one region (as seen from its PoP: far for two PoPs);
(b) a router at each PoP, nearest routing, no cache; (c) (b) with the normalized response cache.
Reports TTFT p50/p95 and origin load (requests the regions counted themselves) for each.
Ctrl-C or SIGTERM stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import msgspec
import uvloop
from bench.outputs import check_folder
from bench.procs import Procs, interruptible, procs
from bench.scenarios.topology import (
    POPS,
    Mesh,
    delay_method,
    delta,
    nearest,
    rtt_ms,
    start_failure,
)

from router.loadgen import LoadSpec, Planned, Sample, Summary, run_load, summarize
from router.loadgen.progress import Progress
from router.loadgen.report import markdown_table, write_results
from router.loadgen.stats import percentile
from router.native import fingerprint

MODEL = "sim-1"
CHAT = "/chat/completions"

# Surface variants: the spacing ones are what the normalized level folds (and exact does not);
# the case ones it keeps apart since 2026-12-04 (README "What `normalized` folds"), so they are
# distinct keys at both levels and cap the hit rate below the mix's repetition.
_VARIANTS: tuple[Callable[[str], str], ...] = (
    lambda p: p,
    str.lower,
    str.upper,
    lambda p: p.replace(" ", "  "),
    lambda p: f"  {p}\n",
)


def workload(n: int, distinct: int, zipf_s: float, rng: random.Random) -> list[str]:
    """n prompts: Zipf-popular questions out of `distinct`, each in a random surface variant."""
    weights = [1.0 / (k**zipf_s) for k in range(1, distinct + 1)]
    picks = rng.choices(range(distinct), weights=weights, k=n)
    return [rng.choice(_VARIANTS)(f"In one sentence, what is topic number {k}?") for k in picks]


def repeat_ceiling(prompts: Sequence[str], max_tokens: int = 8) -> float:
    """The best hit rate the normalized cache can reach on this sequence: 1 - keys / requests,
    the keys being the router's own (native fingerprint at level "normalized") of the bodies
    this scenario sends."""
    keys = {fingerprint(_body(p, max_tokens), level="normalized") for p in prompts}
    return 1.0 - len(keys) / len(prompts) if prompts else 0.0


def _body(prompt: str, max_tokens: int) -> bytes:
    # temperature 0: deterministic, so the cache may store it.
    return msgspec.json.encode(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    )


async def run_phase(
    name: str,
    urls: Mapping[str, str],
    prompts: Mapping[str, Sequence[str]],
    spec: LoadSpec,
    *,
    max_tokens: int,
    quiet: bool,
) -> tuple[list[Sample], float]:
    """All PoPs at once, each its own closed loop of users on its own base URL."""

    def factory_for(pop: str) -> Callable[[int], Planned]:
        url = urls[pop] + CHAT
        bodies = [_body(p, max_tokens) for p in prompts[pop]]
        return lambda i: Planned(url=url, body=bodies[i % len(bodies)], label=pop)

    runs = await asyncio.gather(
        *(
            run_load(
                f"{name}@{pop}",
                spec,
                factory_for(pop),
                progress=None if quiet else Progress(f"{name}@{pop}", 2.0),
            )
            for pop in POPS
        )
    )
    samples = sorted((s for r in runs for s in r.samples), key=lambda s: s.start_s)
    return samples, max(r.wall_s for r in runs)


def expected_ttft_ms(region_of: Callable[[str], str], ttft_ms: float) -> float:
    """p50 TTFT the RTT model predicts when each PoP's users (equal shares) hit region_of(pop)."""
    return percentile(sorted(rtt_ms(pop, region_of(pop)) + ttft_ms for pop in POPS), 0.5)


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.scenarios.global_users",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", type=Path, default=Path("results/global-users"))
    p.add_argument("--requests-per-pop", type=int, default=120, help="per phase and PoP")
    p.add_argument("--users-per-pop", type=int, default=4, help="concurrent users at each PoP")
    p.add_argument("--duration", type=float, default=15.0, help="cap per phase, seconds")
    p.add_argument("--central", choices=POPS, default="us-east", help="the region of (a)")
    p.add_argument("--ttft-ms", type=float, default=60.0, help="the regions' own TTFT")
    p.add_argument("--tokens-per-s", type=float, default=500.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--distinct", type=int, default=100, help="distinct questions in the mix")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity skew of the questions")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--shared-cache",
        action="store_true",
        help="add (d): (c) with a redis-server tier shared by every PoP's router",
    )
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    # Before 15 processes start: a bad option costs a line, not a run.
    if min(args.requests_per_pop, args.users_per_pop, args.distinct, args.max_tokens) < 1:
        p.error("--requests-per-pop, --users-per-pop, --distinct and --max-tokens must be >= 1")
    if not 0 < args.duration <= 600:
        p.error("--duration must be in (0, 600] seconds")
    if not (0 <= args.ttft_ms < math.inf and 0 < args.tokens_per_s < math.inf):
        p.error("--ttft-ms must be finite and >= 0, --tokens-per-s finite and > 0")
    if not 0 <= args.zipf < math.inf:
        p.error("--zipf must be finite and >= 0")
    check_folder(p, "--results", args.results)
    return args


def _per_pop(name: str, samples: Sequence[Sample], wall_s: float) -> list[Summary]:
    return [
        summarize(f"{name} @{pop}", [s for s in samples if s.label == pop], wall_s) for pop in POPS
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run (a), (b), (c) in one go; write results; print the table and the explanation."""
    args = _args(argv)
    return interruptible("global_users", lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """The scenario for parsed, checked options."""
    method = delay_method()
    print(method, file=sys.stderr)
    spec = LoadSpec(
        concurrency=args.users_per_pop,
        duration_s=args.duration,
        max_requests=args.requests_per_pop,
        grace_s=5.0,
    )
    prompts = {
        pop: workload(
            args.requests_per_pop, args.distinct, args.zipf, random.Random(f"{args.seed}:{pop}")
        )
        for pop in POPS
    }
    ceiling = sum(repeat_ceiling(p, args.max_tokens) for p in prompts.values()) / len(POPS)
    phases: list[Summary] = []
    rows: list[Summary] = []
    samples: dict[str, list[Sample]] = {}
    # Process logs stay next to the results: a failed phase is explained by its router's log.
    with procs(args.results / "logs") as pr:
        t0 = time.monotonic()
        mesh = Mesh(pr, ttft_ms=args.ttft_ms, tokens_per_s=args.tokens_per_s, model=MODEL)
        print(f"9 sim regions up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        direct = {pop: mesh.url(pop, args.central) for pop in POPS}
        # Both router sets start together, before any load, so startup never overlaps a phase.
        with ThreadPoolExecutor(max_workers=2) as pool:
            plain = pool.submit(mesh.routers, pr, None)
            cached = pool.submit(mesh.routers, pr, "normalized")
            shared = (
                pool.submit(lambda: mesh.routers(pr, "normalized", _redis_url(pr)))
                if args.shared_cache
                else None
            )
            wait([f for f in (plain, cached, shared) if f is not None])
        print(f"6 routers up, {time.monotonic() - t0:.1f} s since start", file=sys.stderr)
        plan: list[tuple[str, Callable[[], dict[str, str]], list[str]]] = [
            (
                "a-centralized",
                lambda: direct,
                [
                    f"every PoP -> {args.central} directly; model p50 "
                    f"{expected_ttft_ms(lambda _: args.central, args.ttft_ms):.0f} ms"
                ],
            ),
            (
                "b-routed",
                plain.result,
                [
                    f"router per PoP, nearest region; model p50 "
                    f"{expected_ttft_ms(nearest, args.ttft_ms):.0f} ms + router overhead"
                ],
            ),
            (
                "c-routed+cache",
                cached.result,
                [
                    f"(b) + normalized cache per PoP; best possible hit rate on this mix "
                    f"{ceiling:.0%}"
                ],
            ),
        ]
        if shared is not None:
            everyone = [p for pop in POPS for p in prompts[pop]]
            plan.append(
                (
                    "d-routed+shared-cache",
                    shared.result,
                    [
                        "(c) with one Redis tier shared by the three PoPs' routers; best possible "
                        f"hit rate {repeat_ceiling(everyone, args.max_tokens):.0%} (repeats "
                        "across PoPs count)"
                    ],
                )
            )
        for name, urls_of, notes in plan:
            try:
                urls = urls_of()
            except RuntimeError as exc:
                why = start_failure(exc)
                print(f"{name}: skipped, its routers did not start: {why}", file=sys.stderr)
                skipped = summarize(name, [], 0.0)
                skipped.notes.append(f"skipped: a router did not start: {why}")
                phases.append(skipped)
                rows.append(skipped)
                continue
            before = mesh.origin_requests()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                run_samples, wall = runner.run(
                    run_phase(
                        name, urls, prompts, spec, max_tokens=args.max_tokens, quiet=args.quiet
                    )
                )
            print(f"{name}: {len(run_samples)} requests in {wall:.1f} s", file=sys.stderr)
            summary = summarize(name, run_samples, wall, config={"delay": method})
            summary.origin = delta(mesh.origin_requests(), before)
            summary.notes.extend(notes)
            if name.startswith(("c-", "d-")):
                summary.notes.append(_cache_note(summary))
            per_pop = _per_pop(name, run_samples, wall)
            if not name.startswith("a-"):
                summary.notes.append(_routing_note(summary, per_pop))
            phases.append(summary)
            rows += [summary, *per_pop]
            samples[name] = run_samples
    explanation = explain(phases, args)
    text = markdown_table(rows) + "\n" + explanation
    print(text)
    write_results(args.results, rows, title="global users", samples=samples, plots=not args.no_plot)
    (args.results / "results.md").write_text("# global users\n\n" + method + "\n\n" + text)
    print(f"results in {args.results}", file=sys.stderr)
    return 0 if phases and all(0 < p.ok == p.sent for p in phases) else 1


def _cache_note(summary: Summary) -> str:
    hits = summary.cache.get("hit", 0)
    if not summary.cache:
        return "the router sent no x-cache header: the cache is not active in this build"
    return f"cache: {hits}/{summary.ok} hits ({hits / max(summary.ok, 1):.0%}), {summary.cache}"


def _redis_url(pr: Procs) -> str:
    return f"redis://127.0.0.1:{pr.redis().port}/0"


def _routing_note(summary: Summary, per_pop: Sequence[Summary]) -> str:
    """Whether every PoP's requests went to its nearest region, by header and by origin counters."""
    origin = summary.origin or {}
    # Only the nearest region in each PoP's x-router-region headers (cache hits carry none).
    header_ok = all(
        set(row.regions) == {nearest(pop)} for pop, row in zip(POPS, per_pop, strict=True)
    )
    # Cache hits reach no origin, so only "each nearest region got load" holds for (c).
    origin_ok = all(origin.get(nearest(pop), 0) > 0 for pop in POPS)
    if summary.ok and header_ok and origin_ok:
        return f"nearest routing: x-router-region and origin counters agree ({origin})"
    regions = {pop: row.regions for pop, row in zip(POPS, per_pop, strict=True)}
    return f"NOT (only) nearest: x-router-region per PoP {regions}, origin {origin}"


def explain(phases: Sequence[Summary], args: argparse.Namespace) -> str:
    """The measured change against the seed's claim, with the reasons."""
    by = {p.name: p for p in phases}
    lines = ["## Against the seed's claim (p50 TTFT 340 -> 85 ms, origin load -40-60%)", ""]

    def p50(name: str) -> float:
        s = by.get(name)
        return s.ttft_ms.p50 if s is not None and s.ttft_ms is not None else math.nan

    def origin(name: str) -> int:
        s = by.get(name)
        return sum((s.origin or {}).values()) if s is not None else 0

    a, b, c = p50("a-centralized"), p50("b-routed"), p50("c-routed+cache")
    if not math.isnan(a) and not math.isnan(b):
        lines.append(
            f"- TTFT p50: centralized {a:.0f} ms -> routed {b:.0f} ms "
            f"({(b - a) / a:+.0%}); with cache {c:.0f} ms."
        )
    oa, oc = origin("a-centralized"), origin("c-routed+cache")
    if oa and "c-routed+cache" in by and by["c-routed+cache"].ok:
        lines.append(
            f"- Origin load: {oa} requests centralized, {origin('b-routed')} routed, "
            f"{oc} routed + cache ({(oc - oa) / oa:+.0%})."
        )
    od = origin("d-routed+shared-cache")
    if oa and "d-routed+shared-cache" in by and by["d-routed+shared-cache"].ok:
        lines.append(f"- With one shared Redis tier: {od} ({(od - oa) / oa:+.0%}).")
    central: str = args.central
    ttft: float = args.ttft_ms
    far = sorted(POPS, key=lambda pop: rtt_ms(pop, central))[len(POPS) // 2]
    model_b = expected_ttft_ms(nearest, ttft)
    overhead = f"{b - model_b:.0f} ms" if not math.isnan(b) else "n/a"
    saving = f"{(a - b) / a:.0%}" if not (math.isnan(a) or math.isnan(b)) else "not measured"
    lines += [
        f"- Why (TTFT): a request pays one RTT (connections are kept alive, so no TCP/TLS "
        f"handshake per request) plus the region's own {ttft:g} ms. Centralized, the median user "
        f"is at {far}, {rtt_ms(far, central):g} ms from {central}: p50 ~ "
        f"{rtt_ms(far, central) + ttft:.0f} ms. Routed, every PoP is "
        f"{min(rtt_ms(p, nearest(p)) for p in POPS):g}-{max(rtt_ms(p, nearest(p)) for p in POPS):g}"
        f" ms from its nearest region: ~{model_b:.0f} ms plus the router's own cost (measured "
        f"here: {overhead} at p50). The seed's routed 85 ms matches that shape; its centralized "
        f"340 ms needs ~{340 - ttft:.0f} ms of network time for the median user, i.e. users "
        "farther than 100-180 ms or 2-3 round trips per request (a new TCP + TLS connection per "
        "request), which this in-process delay does not model. So the saving here is "
        f"{saving}, not the seed's 75%.",
        "- Why (origin load): routing moves load between regions but does not reduce it; the "
        "cache removes exactly its hits, and hits are bounded by the workload's repetition "
        "as the router keys it (spacing variants fold, case variants do not; per-PoP caches "
        "see only their own users' repeats): the ceiling for this mix is in the (c) note. "
        "Fewer distinct prompts or a shared Redis tier raise it; more lower it; the seed's "
        "-40-60% is a statement about its workload, not about the router.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
