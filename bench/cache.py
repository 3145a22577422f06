"""Response-cache benchmark against a real router + simulated region (subprocesses on 127.0.0.1).

Workload: Zipf-popular intents, each asked in several surface forms (case, spacing, punctuation,
fullwidth look-alikes, no-break spaces), plus unique long-tail questions. Ground truth is the
intent: an answer that belongs to another intent is a WRONG answer. Reports, per cache level,
hit ratio, origin calls saved and wrong answers; then the published false-hit set
(tests/cache_key_sets.py: pairs that must not share a key), each pair asked in its own
conversation, the second of each pair must miss; then hit-path vs miss-path latency and RPS.

    python -m bench.cache            # default run, well under 60 s
    python -m bench.cache --help
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
from tests.cache_key_sets import FALSE_HITS
from tests.support import Proc, free_port, router_cmd, spawn

from router.core.timing import parse_server_timing
from router.sim.text import full_chat_text

LEVELS = {"exact": "bench-exact", "normalized": "bench-normalized"}
JSON = {"Content-Type": "application/json"}
ROUNDS = 3

_ACTIONS = [
    "reset",
    "change",
    "find",
    "delete",
    "export",
    "import",
    "share",
    "rename",
    "restore",
    "enable",
    "disable",
]
_OBJECTS = [
    "password",
    "email",
    "invoice",
    "account",
    "profile",
    "report",
    "backup",
    "photo",
    "calendar",
    "contact",
    "subscription",
    "address",
    "playlist",
    "note",
    "folder",
]
_PLACES = ("on the web app", "on my phone", "in the admin panel", "for my team", "in the app")
_OPENERS = ("how do i", "how can i", "what is the way to", "where can i")

# Surface forms of one question; each keeps the intent and changes only its spelling.
FORMS = ("plain", "lower", "upper", "spaced", "punct", "fullwidth", "nbsp")


def fullwidth(text: str) -> str:
    """ASCII letters and digits as their fullwidth look-alikes (U+FF01..U+FF5E)."""
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in text)


def surface(text: str, form: str) -> str:
    """`text` (a plain question ending in '?') spelled in surface form `form`."""
    if form == "plain":
        return text
    if form == "lower":
        return text.lower()
    if form == "upper":
        return text.upper()
    if form == "spaced":
        return "  " + text.replace(" ", "   ") + " "
    if form == "punct":
        return text.rstrip("?") + "??!"
    if form == "fullwidth":
        return fullwidth(text)
    if form == "nbsp":
        return text.replace(" ", "\u00a0")
    raise ValueError(form)


def intents(n: int, rng: random.Random) -> list[str]:
    """`n` distinct questions from shared templates, so many differ by a single word."""
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        q = (
            f"{rng.choice(_OPENERS).capitalize()} {rng.choice(_ACTIONS)} my "
            f"{rng.choice(_OBJECTS)} {rng.choice(_PLACES)}?"
        )
        if q.lower() not in seen:
            seen.add(q.lower())
            out.append(q)
    return out


@dataclass(frozen=True, slots=True)
class Query:
    """One request of the workload and its ground truth."""

    intent: int
    text: str


def workload(
    *, requests: int, n_intents: int, unique: float, zipf_s: float, seed: int
) -> tuple[list[Query], dict[int, list[str]]]:
    """The queries in order, and every surface text asked per intent (for the answer check)."""
    rng = random.Random(seed)
    base = intents(n_intents, rng)
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(n_intents)]
    texts: dict[int, list[str]] = {}
    queries: list[Query] = []
    for i in range(requests):
        if rng.random() < unique:
            intent = n_intents + i  # a long-tail question nobody else asks
            text = f"Question {i}: {rng.choice(base)} (ticket {rng.randrange(10**9)})"
        else:
            intent = rng.choices(range(n_intents), weights)[0]
            text = surface(base[intent], rng.choice(FORMS))
        texts.setdefault(intent, []).append(text)
        queries.append(Query(intent, text))
    return queries, texts


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def body(model: str, text: str) -> bytes:
    return msgspec.json.encode({"model": model, "temperature": 0, "messages": messages(text)})


@dataclass(slots=True)
class LevelResult:
    level: str
    requests: int = 0
    hits: int = 0
    origin_calls: int = 0
    wrong: int = 0
    errors: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    @property
    def saved(self) -> float:
        return 1 - self.origin_calls / self.requests if self.requests else 0.0


async def sim_requests(session: aiohttp.ClientSession, sim: Proc) -> int:
    async with session.get(f"{sim.url}/sim/stats") as r:
        n: int = (await r.json())["requests"]
        return n


async def run_level(
    session: aiohttp.ClientSession,
    router: Proc,
    sim: Proc,
    level: str,
    queries: Sequence[Query],
    texts: dict[int, list[str]],
    concurrency: int,
) -> LevelResult:
    """Send the workload through one cache level; check every answer against ground truth."""
    model = LEVELS[level]
    # The answer each surface text gets from the origin, by intent: any of them is right.
    answers: dict[str, int] = {}
    for intent, forms in texts.items():
        for t in forms:
            answers[full_chat_text(model, messages(t))] = intent
    result = LevelResult(level)
    before = await sim_requests(session, sim)
    it = iter(queries)

    async def worker() -> None:
        for q in it:
            async with session.post(
                f"{router.url}/v1/chat/completions",
                data=body(model, q.text),
                headers=JSON,
            ) as r:
                raw = await r.read()
                result.requests += 1
                if r.status != 200:
                    result.errors += 1
                    continue
                if r.headers.get("x-cache") == "HIT":
                    result.hits += 1
                content = msgspec.json.decode(raw)["choices"][0]["message"]["content"]
                if answers.get(content) != q.intent:
                    result.wrong += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.origin_calls = await sim_requests(session, sim) - before
    return result


@dataclass(slots=True)
class FalseHitResult:
    level: str
    pairs: int = 0
    hits: int = 0
    wrong: int = 0
    errors: int = 0


async def run_false_hits(
    session: aiohttp.ClientSession, router: Proc, level: str
) -> FalseHitResult:
    """Ask each false-hit pair's first text, then its second: the second must be a MISS with
    its own answer. A system message per pair keeps the pairs from meeting each other."""
    model = LEVELS[level]
    result = FalseHitResult(level)
    for i, pair in enumerate(FALSE_HITS):
        result.pairs += 1
        for n, text in enumerate((pair.a, pair.b)):
            chat = [{"role": "system", "content": f"false-hit pair {i}"}, *messages(text)]
            raw = msgspec.json.encode({"model": model, "temperature": 0, "messages": chat})
            async with session.post(
                f"{router.url}/v1/chat/completions", data=raw, headers=JSON
            ) as r:
                answer = await r.read()
                if r.status != 200:
                    result.errors += 1
                    continue
                if n == 1 and r.headers.get("x-cache") == "HIT":
                    result.hits += 1
                content = msgspec.json.decode(answer)["choices"][0]["message"]["content"]
                if content != full_chat_text(model, chat):
                    result.wrong += 1
    return result


@dataclass(slots=True)
class Latency:
    name: str
    samples_ms: list[float] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)
    cache_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    errors: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def pct(self, p: float, values: Sequence[float] | None = None) -> float:
        data = sorted(self.samples_ms if values is None else values)
        if not data:
            return float("nan")
        return data[min(len(data) - 1, int(p / 100 * len(data)))]

    @property
    def rps(self) -> float:
        return len(self.samples_ms) / self.seconds if self.seconds else 0.0


async def measure(
    session: aiohttp.ClientSession,
    router: Proc,
    name: str,
    bodies: Sequence[bytes],
    concurrency: int,
    max_seconds: float,
    expect: str,
) -> Latency:
    """Closed loop at `concurrency` over `bodies` (bounded by count and time)."""
    out = Latency(name)
    it = iter(bodies)
    deadline = time.monotonic() + max_seconds

    async def worker() -> None:
        for b in it:
            if time.monotonic() > deadline:
                return
            began = time.perf_counter()
            async with session.post(
                f"{router.url}/v1/chat/completions",
                data=b,
                headers=JSON,
            ) as r:
                await r.read()
                elapsed = (time.perf_counter() - began) * 1000
                if r.status != 200 or r.headers.get("x-cache") != expect:
                    out.errors += 1
                    why = f"HTTP {r.status} x-cache={r.headers.get('x-cache')}"
                    out.reasons[why] = out.reasons.get(why, 0) + 1
                    continue
                out.samples_ms.append(elapsed)
                timing = parse_server_timing(r.headers.get("Server-Timing", ""))
                if "total" in timing:
                    out.server_ms.append(timing["total"])
                if "cache" in timing:
                    out.cache_ms.append(timing["cache"])

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.seconds = time.perf_counter() - began
    return out


CONFIG = """
[server]
listen = "127.0.0.1:{port}"

[auth]
enabled = false

[observability]
access_log = false

[[regions]]
name = "sim"
base_url = "{sim}/v1"
models = ["bench-exact", "bench-normalized"]

[cache]
enabled = true
level = "exact"
max_bytes = 268435456

[cache.models.bench-normalized]
level = "normalized"
"""


def start(tmp: Path, ttft_ms: float) -> tuple[Proc, Proc]:
    sim_port = free_port()
    sim = spawn(
        router_cmd(
            "sim-region",
            "--port",
            str(sim_port),
            "--models",
            ",".join(LEVELS.values()),
            "--ttft-ms",
            str(ttft_ms),
        ),
        sim_port,
        tmp / "sim.log",
    )
    port = free_port()
    cfg = tmp / "router.toml"
    cfg.write_text(CONFIG.format(port=port, sim=sim.url))
    try:
        router = spawn(router_cmd("serve", "--config", str(cfg)), port, tmp / "router.log")
    except Exception:
        sim.kill()
        raise
    return sim, router


async def run(args: argparse.Namespace, sim: Proc, router: Proc) -> int:
    queries, texts = workload(
        requests=args.requests,
        n_intents=args.intents,
        unique=args.unique,
        zipf_s=args.zipf,
        seed=args.seed,
    )
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        levels = [
            await run_level(session, router, sim, level, queries, texts, args.concurrency)
            for level in LEVELS
        ]
        false_hits = [await run_false_hits(session, router, level) for level in LEVELS]
        # Hit path: one cached request, over and over. Miss path: unique questions.
        hot = body(LEVELS["exact"], "latency probe, cached")
        async with session.post(f"{router.url}/v1/chat/completions", data=hot, headers=JSON) as r:
            await r.read()
            assert r.status == 200, r.status
        # Interleaved rounds, so a burst of load from elsewhere on the machine hits both paths.
        hit, miss = Latency("hit"), Latency("miss")
        per_round = args.latency_requests // ROUNDS
        cap = args.latency_seconds / ROUNDS
        for r in range(ROUNDS):
            merge(
                hit,
                await measure(
                    session, router, "hit", [hot] * per_round, args.latency_concurrency, cap, "HIT"
                ),
            )
            misses = [
                body(LEVELS["exact"], f"latency probe, unique {r}.{i} {args.seed}")
                for i in range(per_round)
            ]
            merge(
                miss,
                await measure(
                    session, router, "miss", misses, args.latency_concurrency, cap, "MISS"
                ),
            )
    return report(args, levels, false_hits, hit, miss)


def merge(into: Latency, part: Latency) -> None:
    """Fold one round into the total."""
    into.samples_ms += part.samples_ms
    into.server_ms += part.server_ms
    into.cache_ms += part.cache_ms
    into.seconds += part.seconds
    into.errors += part.errors
    for why, n in part.reasons.items():
        into.reasons[why] = into.reasons.get(why, 0) + n


def report(
    args: argparse.Namespace,
    levels: Sequence[LevelResult],
    false_hits: Sequence[FalseHitResult],
    hit: Latency,
    miss: Latency,
) -> int:
    print(
        f"\nworkload: {args.requests} requests, {args.intents} intents (Zipf s={args.zipf}), "
        f"{len(FORMS)} surface forms, {args.unique:.0%} unique long-tail, "
        f"c={args.concurrency}, sim TTFT {args.ttft_ms:g} ms\n"
    )
    print("| level | requests | hits | hit ratio | origin calls | saved | wrong | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in levels:
        print(
            f"| {r.level} | {r.requests} | {r.hits} | {r.hit_ratio:.1%} | {r.origin_calls} | "
            f"{r.saved:.1%} | {r.wrong} | {r.errors} |"
        )
    print("\nfalse-hit set (tests/cache_key_sets.py): the second text of each pair must miss\n")
    print("| level | pairs | hits | wrong | errors |")
    print("|---|---:|---:|---:|---:|")
    for f in false_hits:
        print(f"| {f.level} | {f.pairs} | {f.hits} | {f.wrong} | {f.errors} |")
    print(
        f"\nlatency at c={args.latency_concurrency} "
        "(client-observed; server = Server-Timing `total`, handler start to response "
        "headers; cache stage = fingerprint + lookup)\n"
    )
    print(
        "| path | requests | RPS | p50 ms | p99 ms | server p50 ms | server p99 ms "
        "| cache stage p50 ms | cache stage p99 ms | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for lat in (hit, miss):
        print(
            f"| {lat.name} | {len(lat.samples_ms)} | {lat.rps:.0f} | {lat.pct(50):.2f} | "
            f"{lat.pct(99):.2f} | {lat.pct(50, lat.server_ms):.3f} | "
            f"{lat.pct(99, lat.server_ms):.3f} | {lat.pct(50, lat.cache_ms):.3f} | "
            f"{lat.pct(99, lat.cache_ms):.3f} | {lat.errors} |"
        )
    for lat in (hit, miss):
        if lat.reasons:
            print(f"{lat.name} errors: {lat.reasons}")
    ratio = hit.rps / miss.rps if miss.rps else float("inf")
    best = max(levels, key=lambda r: r.saved)
    checks = {
        "origin calls saved >= 40% (best level)": best.saved >= 0.40,
        "zero wrong answers (all levels)": all(r.wrong == 0 for r in levels),
        "false-hit set: zero hits, zero wrong (all levels)": all(
            f.hits == 0 and f.wrong == 0 for f in false_hits
        ),
        "no errors": all(r.errors == 0 for r in levels)
        and all(f.errors == 0 for f in false_hits)
        and not hit.errors
        and not miss.errors,
        "hit RPS >= 3x miss RPS": ratio >= 3,
        "hit p99 < 1 ms (server-side)": hit.pct(99, hit.server_ms) < 1.0,
    }
    print(f"\nhit/miss RPS ratio: {ratio:.1f}x\n")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.cache", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=1500, help="workload size per level")
    p.add_argument("--intents", type=int, default=150)
    p.add_argument("--unique", type=float, default=0.25, help="fraction of long-tail queries")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of intent popularity")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--ttft-ms", type=float, default=20.0, help="the sim's time to first token")
    p.add_argument("--latency-requests", type=int, default=3000)
    p.add_argument("--latency-concurrency", type=int, default=32)
    p.add_argument(
        "--latency-seconds", type=float, default=12.0, help="cap per path, over all rounds"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        sim, router = start(Path(tmp), args.ttft_ms)
        try:
            return asyncio.run(run(args, sim, router))
        finally:
            router.kill()
            sim.kill()


if __name__ == "__main__":
    sys.exit(main())
