"""The /status.json document built from telemetry (no sockets)."""

from __future__ import annotations

import pytest

from router.observability.access_log import AccessRecord
from router.observability.metrics import RegionState, Telemetry
from router.observability.slo import SloTargets, SloTracker
from router.observability.status import feed

MS = 1_000_000


def test_feed_merges_health_slo_and_counters() -> None:
    states = [RegionState("eu", True, 0.004, 2, 1, 0), RegionState("us", False, None, 0, 0, 3)]
    now = [10.0]
    t = Telemetry(
        slo=SloTracker(SloTargets(window_s=60.0)), regions=lambda: states, clock=lambda: now[0]
    )
    for _ in range(4):
        t.finish(AccessRecord(request_id="a", status=200, region="eu", cache="miss",
                              stages={"ttft": 40 * MS, "total": 50 * MS}))  # fmt: skip
    t.finish(AccessRecord(request_id="b", status=200, cache="hit", stages={"ttft": MS}))
    t.finish(AccessRecord(request_id="c", status=429))
    t.finish(AccessRecord(request_id="d", status=502, region="ap"))
    # The attempts behind those requests: a region's errors are its attempts'.
    for _ in range(4):
        t.metrics.attempt("eu", "ok")
    t.metrics.attempt("ap", "server_error")
    doc = feed(t, now[0], 1_700_000_000.0)
    assert doc["ts"] == 1_700_000_000.0
    assert doc["slo"] == {"ttft_p95_target_ms": 200.0, "error_rate_target": 0.001, "window_s": 60.0}
    assert doc["cache"] == {"hits": 1, "misses": 4, "hit_ratio": pytest.approx(0.2)}
    assert doc["rate_limited"] == 1
    # The 429 is the client's own: counted apart (rate_limited), not for the objectives.
    assert doc["overall"]["requests"] == 6
    assert doc["overall"]["errors_ok"] is False  # 1 in 6 is well over 0.1%
    regions = {r["name"]: r for r in doc["regions"]}
    assert [r["name"] for r in doc["regions"]] == ["eu", "us", "ap"]
    eu = regions["eu"]
    assert (eu["healthy"], eu["rtt_ms"], eu["in_flight"], eu["queue_depth"]) == (True, 4.0, 2, 1)
    assert eu["ttft_p50_ms"] == pytest.approx(40.0, rel=0.01)
    assert eu["error_rate"] == 0.0
    assert regions["us"]["healthy"] is False
    assert regions["us"]["ejections"] == 3
    assert regions["us"]["requests"] == 0
    # A region with traffic but unknown to the health snapshot is shown, health unknown.
    assert regions["ap"]["healthy"] is None
    assert regions["ap"]["error_rate"] == 1.0
