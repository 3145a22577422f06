"""bench/critical_path.py: the stamps keep requests apart, and a short real run stamps every
segment of real requests through a real router."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from bench.critical_path import BASE_HOPS, HOPS, SEGMENTS, _Stamps

from tests.support import run_bench


def _walk(stamps: _Stamps, points: int) -> None:
    stamps.begin()
    for index in range(1, points):
        stamps.point(index)
    stamps.end()


def test_a_whole_request_is_kept_and_an_incomplete_one_is_not() -> None:
    stamps = _Stamps()
    _walk(stamps, len(SEGMENTS))
    _walk(stamps, 3)  # ended before it reached the region (an error answer, say)
    assert stamps.dropped == 1
    (kept,) = stamps.done
    assert len(kept) == len(SEGMENTS) + 1
    assert kept == sorted(kept)


def test_overlapping_requests_are_left_out() -> None:
    stamps = _Stamps()
    stamps.begin()
    stamps.point(1)
    stamps.begin()  # a second request arrives while the first is open
    for index in range(2, len(SEGMENTS)):
        stamps.point(index)
    stamps.end()
    stamps.end()
    assert stamps.done == []
    assert stamps.dropped == 1
    _walk(stamps, len(SEGMENTS))  # the next lone request is kept
    assert len(stamps.done) == 1


def test_points_out_of_order_are_ignored() -> None:
    stamps = _Stamps()
    stamps.begin()
    stamps.point(2)  # not reached point 1 yet: ignored
    stamps.point(1)
    stamps.point(1)  # reached again (a second write): the first time counts
    assert stamps.open is not None
    assert len(stamps.open) == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stream", [False, True])
def test_a_short_run_stamps_every_segment_of_every_hop(tmp_path: Path, stream: bool) -> None:
    out = tmp_path / "report.json"
    args = ["--rate", "50", "--duration", "1", "--rounds", "1", "--json", str(out)]
    text = run_bench("critical_path", *args, *(["--stream"] if stream else []))
    report = json.loads(out.read_text())
    assert report["stream"] is stream
    assert report["direct_p50_ms"] > 0
    assert list(report["hops"]) == list(HOPS)
    names = [name for name, _ in SEGMENTS]
    for hop in report["hops"].values():
        assert hop["requests"] > 10
        assert list(hop["p50_us"]) == names
        assert all(hop["p50_us"][name] > 0 for name in names)
        assert hop["p50_ms"] > 0
    for name in names:
        assert f"| {name} |" in text


@pytest.mark.timeout(120)
def test_the_baseline_hops_run_on_the_interpreter_given(tmp_path: Path) -> None:
    """`--baseline TREE --baseline-python PY`: the `@base` hops are TREE's, started by PY."""
    marks = tmp_path / "started"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {marks}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "report.json"
    tree = Path(__file__).resolve().parents[2]
    args = ["--rate", "50", "--duration", "1", "--rounds", "1", "--json", str(out)]
    run_bench("critical_path", *args, "--baseline", str(tree), "--baseline-python", str(python))
    report = json.loads(out.read_text())
    assert list(report["hops"]) == [*HOPS, *(f"{hop}@base" for hop in BASE_HOPS)]
    started = marks.read_text().splitlines()
    assert len(started) == 2  # router@base and router-core@base, nothing else
    assert all("--serve" in line for line in started)
    assert sum("--core" in line for line in started) == 1
