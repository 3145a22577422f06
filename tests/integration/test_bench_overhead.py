"""bench/overhead.py: CPU placement, and a short real run whose answers all match the region's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.overhead import on_cpus, split_placement

from tests.support import REPO


def test_split_gives_the_first_cpu_to_the_hops_under_test() -> None:
    place = split_placement([2, 0, 1])
    assert place is not None
    assert place.proxies == {0}
    assert place.rest == {1, 2}
    assert "CPU 0;" in place.describe()
    assert split_placement([3]) is None


def test_commands_are_confined_with_taskset() -> None:
    assert on_cpus(["router", "serve"], None) == ["router", "serve"]
    assert on_cpus(["router"], frozenset({2, 0})) == ["taskset", "-c", "0,2", "router"]


def test_a_short_run_measures_every_target_without_mismatches(tmp_path: Path) -> None:
    out = tmp_path / "cells.json"
    args = ["--duration", "0.4", "--warmup", "0.1", "--rounds", "2", "--concurrency", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead", *args, "--rate", "50", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("placement: ")
    report = json.loads(out.read_text())
    cells = report["cells"]
    targets = {"direct", "tcp-relay", "passthrough", "router", "router-core"}
    modes = {"non-stream", "non-stream @50/s", "stream", "stream @50/s"}
    assert {(c["target"], c["mode"]) for c in cells} == {(t, m) for t in targets for m in modes}
    assert all(c["errors"] == 0 and c["requests"] > 0 for c in cells)
