"""Per-request cost of region selection: score, filter, order and power-of-two-choices."""

from __future__ import annotations

import random

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from router.routing.selection import Candidate, select


def _regions(n: int) -> list[Candidate]:
    # Three distances; the third region has no TTFT yet (filled with the best known one).
    return [
        Candidate(
            name=f"r{i}",
            available=True,
            ewma_rtt_s=0.02 * (i + 1),
            ewma_ttft_s=None if i == 2 else 0.1,
            in_flight=i,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("regions", [1, 3])
def test_select(benchmark: BenchmarkFixture, regions: int) -> None:
    candidates = _regions(regions)
    rng = random.Random(1)
    chosen = benchmark(lambda: select(candidates, tolerance_s=0.03, rng=rng))
    # The two nearest are within 30 ms of each other: either may lead, the far one is last.
    names = [r.name for r in chosen.order]
    assert sorted(names) == [f"r{i}" for i in range(regions)]
    if regions == 3:
        assert names[0] in {"r0", "r1"}
        assert names[2] == "r2"
