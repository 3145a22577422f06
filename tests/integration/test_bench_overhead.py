"""bench/overhead.py: CPU placement, and a short real run whose answers all match the region's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.overhead import Cell, on_cpus, scaling, split_placement, table
from bench.procs import NGINX

from tests.support import run_bench


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


def _cell(target: str, mode: str, p50: float, rps: float = 100.0) -> Cell:
    return Cell(target, mode, 32, 10, 0, rps, p50, 2 * p50, 100.0)


def test_table_gives_added_latency_over_direct_and_over_the_byte_relay() -> None:
    cells = [
        _cell("direct", "stream", 4.0, rps=1000),
        _cell("tcp-relay", "stream", 5.0, rps=800),
        _cell("passthrough", "stream", 6.0, rps=500),
        _cell("router", "stream", 5.5, rps=400),
        _cell("direct", "stream @300/s", 0.5),
        _cell("tcp-relay", "stream @300/s", 0.75),
        _cell("passthrough", "stream @300/s", 1.0),
        _cell("router", "stream @300/s", 1.0),
    ]
    lines = table(cells).splitlines()[2:]
    rows = {
        (cols[0], cols[2]): cols
        for cols in ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    }
    # mode, c, target, RPS, p50, p99, added p50, added p99, over relay, vs pass-through, ...
    closed = rows[("stream (TTFT)", "router")]
    assert closed[6:10] == ["+1.50", "+3.00", "", "80%"]
    paced = rows[("stream @300/s (TTFT)", "router")]
    assert paced[6:10] == ["+0.50", "+1.00", "+0.25", ""]
    assert rows[("stream @300/s (TTFT)", "tcp-relay")][8] == ""


def test_a_short_run_measures_every_target_without_mismatches(tmp_path: Path) -> None:
    out = tmp_path / "cells.json"
    args = ["--duration", "0.4", "--warmup", "0.1", "--rounds", "2", "--concurrency", "4"]
    stdout = run_bench("overhead", *args, "--rate", "50", "--json", str(out))
    assert stdout.startswith("placement: ")
    report = json.loads(out.read_text())
    cells = report["cells"]
    targets = {"direct", "tcp-relay", "passthrough", "router", "router-core", "router-core-aiohttp"}
    if shutil.which(NGINX) is not None:  # make setup and CI install it
        targets.add("nginx")
    modes = {"non-stream", "non-stream @50/s", "stream", "stream @50/s"}
    assert {(c["target"], c["mode"]) for c in cells} == {(t, m) for t in targets for m in modes}
    assert all(c["errors"] == 0 and c["requests"] > 0 for c in cells)


def test_scaling_compares_each_worker_count_with_the_first() -> None:
    cells = [
        _cell("router-w1", "non-stream", 5.0, rps=1000),
        _cell("router-w2", "non-stream", 4.0, rps=1500),
    ]
    (line,) = scaling(cells, [1, 2]).splitlines()
    assert "workers 1 -> 2: RPS x1.50 (1000 -> 1500)" in line


def test_a_short_workers_run_answers_correctly(tmp_path: Path) -> None:
    out = tmp_path / "workers.json"
    args = ["--workers", "1", "2", "--duration", "0.4", "--warmup", "0.1", "--rounds", "1"]
    stdout = run_bench("overhead", *args, "--concurrency", "4", "--rate", "0", "--json", str(out))
    assert "workers 1 -> 2: RPS x" in stdout
    cells = json.loads(out.read_text())["cells"]
    assert {c["target"] for c in cells} == {"direct", "router-w1", "router-w2"}
    assert all(c["errors"] == 0 and c["requests"] > 0 for c in cells)
