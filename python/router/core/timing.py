"""Stage names and the `Server-Timing` header, over the stages context.StageTimer records."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

# The stages of one request, in request order; metrics and the access log use these names.
AUTH = "auth"
PARSE = "parse"  # read, validate and route the body to a model
RATE_LIMIT = "ratelimit"
CACHE = "cache"
UPSTREAM = "upstream"  # selection and attempts, to the first byte (queue, connect inside it)
QUEUE = "queue"
CONNECT = "connect"
REGION_TTFT = "region_ttft"
STREAM = "stream"  # a stream's relay, first byte to its end
TTFT = "ttft"
TOTAL = "total"
STAGES = (
    AUTH,
    PARSE,
    RATE_LIMIT,
    CACHE,
    UPSTREAM,
    QUEUE,
    CONNECT,
    REGION_TTFT,
    STREAM,
    TTFT,
    TOTAL,
)

# Stages measured from the start of the request rather than as spans of their own: they
# overlap the others, so they are left out when checking that the spans fit in the total.
FROM_START = frozenset({TTFT, TOTAL})


def totals(stages: Iterable[tuple[str, int]]) -> dict[str, int]:
    """(name, ns) pairs -> ns per name; a stage entered twice (a retry) adds up."""
    out: dict[str, int] = {}
    for name, ns in stages:
        out[name] = out.get(name, 0) + ns
    return out


def server_timing(durations: Mapping[str, int], only: Iterable[str] | None = None) -> str:
    """The `Server-Timing` header value: `auth;dur=0.041, total;dur=12.500` (ms)."""
    if only is None:
        return ", ".join([f"{n};dur={ns / 1e6:.3f}" for n, ns in durations.items()])
    return ", ".join([f"{n};dur={durations[n] / 1e6:.3f}" for n in only if n in durations])


def parse_server_timing(header: str) -> dict[str, float]:
    """Stage -> milliseconds from a `Server-Timing` header (tests, `router top`)."""
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                out[name] = float(value)
    return out


class StageTimer:
    """Records named stage durations (ns), summed per name in the order first seen (what
    `totals` makes of the pairs); observability renders Server-Timing."""

    __slots__ = ("_open", "durations", "start_ns")

    def __init__(self) -> None:
        self.start_ns = time.perf_counter_ns()
        # Summed as recorded: the header and the access record read them as they are.
        self.durations: dict[str, int] = {}
        self._open: dict[str, int] = {}

    def begin(self, name: str) -> None:
        """Start timing stage `name`."""
        self._open[name] = time.perf_counter_ns()

    def end(self, name: str) -> None:
        """Stop timing stage `name` (a no-op if it was never begun)."""
        began = self._open.pop(name, None)
        if began is not None:
            durations = self.durations
            durations[name] = durations.get(name, 0) + time.perf_counter_ns() - began

    def end_open(self) -> None:
        """Stop every stage still timing (a request that failed inside one)."""
        for name in list(self._open):
            self.end(name)

    def record(self, name: str, duration_ns: int) -> None:
        """Add a stage measured elsewhere."""
        durations = self.durations
        durations[name] = durations.get(name, 0) + duration_ns

    def elapsed_ns(self) -> int:
        """Nanoseconds since the request arrived."""
        return time.perf_counter_ns() - self.start_ns
