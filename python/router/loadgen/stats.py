"""Pure: exact percentiles and distribution summaries from recorded samples."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import msgspec

# The quantiles every report shows; p99.9 is only meaningful with >= 1000 samples.
QUANTILES: tuple[tuple[str, float], ...] = (
    ("p50", 0.50),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99.9", 0.999),
)


class Dist(msgspec.Struct, frozen=True, kw_only=True):
    """A latency distribution in milliseconds."""

    n: int
    mean: float
    min: float
    max: float
    p50: float
    p95: float
    p99: float
    p999: float = msgspec.field(name="p99.9")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, linear between closest ranks (numpy's default)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside 0..1")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def distribution(seconds: Iterable[float]) -> Dist | None:
    """Summarize durations given in seconds as a Dist in milliseconds; None when empty."""
    ms = sorted(s * 1000.0 for s in seconds)
    if not ms:
        return None
    p = {name: percentile(ms, q) for name, q in QUANTILES}
    return Dist(
        n=len(ms),
        mean=math.fsum(ms) / len(ms),
        min=ms[0],
        max=ms[-1],
        p50=p["p50"],
        p95=p["p95"],
        p99=p["p99"],
        p999=p["p99.9"],
    )
