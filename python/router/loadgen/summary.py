"""Pure: a run's samples reduced to the figures a report shows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec

from router.loadgen.sample import Sample
from router.loadgen.stats import Dist, distribution


class Summary(msgspec.Struct, kw_only=True):
    """One run's results: counts, rates, latency distributions (ms) and traffic per region."""

    name: str
    wall_s: float
    sent: int  # every request the run recorded, client_saturated (never sent) included
    ok: int
    errors: dict[str, int]
    rps: float  # requests sent and finished (ok or not) per second; client_saturated not counted
    ok_rps: float
    ttft_ms: Dist | None
    itl_ms: Dist | None
    total_ms: Dist | None
    regions: dict[str, int]  # from x-router-region, successful requests only
    cache: dict[str, int]  # from x-router-cache
    origin: dict[str, int] | None = None  # requests each origin counted itself, when known
    notes: list[str] = []
    config: dict[str, object] = {}


def summarize(
    name: str,
    samples: Sequence[Sample],
    wall_s: float,
    *,
    config: Mapping[str, object] | None = None,
) -> Summary:
    """Reduce samples to a Summary; latency figures use successful requests only."""
    ok = [s for s in samples if s.ok]
    errors = Counter(s.error for s in samples if s.error is not None)
    regions = Counter(s.region for s in ok if s.region is not None)
    cache = Counter(s.cache for s in ok if s.cache is not None)
    # A client_saturated arrival never left the generator: it is no request the server handled.
    finished = sum(s.error != "client_saturated" for s in samples)
    per_s = finished / wall_s if wall_s > 0 else 0.0
    return Summary(
        name=name,
        wall_s=wall_s,
        sent=len(samples),
        ok=len(ok),
        errors=dict(sorted(errors.items())),
        rps=per_s,
        ok_rps=len(ok) / wall_s if wall_s > 0 else 0.0,
        ttft_ms=distribution(s.ttft_s for s in ok if s.ttft_s is not None),
        itl_ms=distribution(gap for s in ok for gap in s.itl_s),
        total_ms=distribution(s.total_s for s in ok),
        regions=dict(sorted(regions.items())),
        cache=dict(sorted(cache.items())),
        config=dict(config or {}),
    )


def region_timeline(
    samples: Sequence[Sample], bin_s: float
) -> tuple[list[float], dict[str, list[int]]]:
    """Successful requests per region per time bin (by start time): (bin starts, counts)."""
    if bin_s <= 0:
        raise ValueError("bin_s must be positive")
    ok = [s for s in samples if s.ok]
    if not ok:
        return [], {}
    nbins = int(max(s.start_s for s in ok) // bin_s) + 1
    series: dict[str, list[int]] = {}
    for s in ok:
        row = series.setdefault(s.region or "unknown", [0] * nbins)
        row[int(s.start_s // bin_s)] += 1
    return [i * bin_s for i in range(nbins)], dict(sorted(series.items()))
