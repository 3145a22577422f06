"""bench/gc_pauses.py: its figures from a pass list, and a short real run that times real
collector passes of a real router and the same tree as a baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.gc_pauses import summarize, table

from tests.support import run_bench


def test_figures_from_the_passes_and_the_latencies() -> None:
    latencies = [0.001 * i for i in range(1, 101)]
    hop = summarize(100, 2, latencies, [[0, 0.002, 10], [2, 0.030, 5]])
    assert (hop.requests, hop.errors, hop.passes, hop.collected) == (100, 2, 2, 15)
    assert hop.pause_ms == pytest.approx(32.0)
    assert hop.longest_ms == pytest.approx(30.0)
    assert 49.0 <= hop.p50_ms <= 52.0
    assert hop.p99_ms >= 99.0
    idle = summarize(0, 0, [], [])
    assert (idle.passes, idle.pause_ms, idle.longest_ms, idle.p50_ms) == (0, 0.0, 0.0, 0.0)
    rows = table({"router": hop, "router@base": idle}, stream=False)
    assert rows.splitlines()[0].startswith("| non-stream | requests |")
    assert "| router | 100 (2 errors) |" in rows
    assert "| 2 | 32.0 / 30.0 | 15 |" in rows


@pytest.mark.timeout(120)
def test_a_short_run_times_both_hops(tmp_path: Path) -> None:
    out = tmp_path / "gc.json"
    args = ["--duration", "2", "--rounds", "1", "--concurrency", "4", "--baseline", "."]
    text = run_bench("gc_pauses", *args, "--json", str(out))
    assert "| non-stream | requests |" in text
    hops = json.loads(out.read_text())
    assert sorted(hops) == ["router", "router@base"]
    for hop in hops.values():
        assert hop["requests"] > 0
        assert hop["errors"] == 0
        assert 0 < hop["p50_ms"] <= hop["p99_ms"]
        assert hop["passes"] >= 0
        # The same tree: a request path that leaves no cycles leaves the collector nothing.
        assert hop["collected"] < hop["requests"]
