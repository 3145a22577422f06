"""`router top` rendering of a status document."""

from __future__ import annotations

from router.observability.access_log import AccessRecord
from router.observability.metrics import RegionState, Telemetry
from router.observability.status import feed
from router.observability.top import render

MS = 1_000_000


def test_render_shows_every_region_and_the_objectives() -> None:
    states = [RegionState("eu-west", True, 0.0042, 3, 1, 0), RegionState("us-east", False)]
    t = Telemetry(regions=lambda: states, clock=lambda: 5.0)
    for _ in range(3):
        t.finish(AccessRecord(request_id="x", status=200, region="eu-west", cache="miss",
                              stages={"ttft": 300 * MS, "total": 310 * MS}))  # fmt: skip
    t.finish(AccessRecord(request_id="y", status=502, region="us-east"))
    for _ in range(3):
        t.metrics.attempt("eu-west", "ok")
    t.metrics.attempt("us-east", "timeout")
    lines = render(feed(t, 5.0, 0.0)).splitlines()
    assert "requests 4" in lines[0]
    assert "objective p95 < 200.0ms: MISSED" in lines[1]  # 300 ms TTFT
    assert "25.00%" in lines[2]  # one 5xx in four
    assert lines[4].split() == ["region", "health", "rtt", "p50", "p95", "in-flight", "queued",
                                "errors", "ejections", "requests"]  # fmt: skip
    eu = lines[5].split()
    assert eu[:3] == ["eu-west", "up", "4.2ms"]
    assert eu[5:7] == ["3", "1"]
    us = lines[6].split()
    assert us[:2] == ["us-east", "DOWN"]
    assert us[7] == "100.00%"
