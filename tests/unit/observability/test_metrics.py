"""Metrics fed with known requests: exact counts, labels, buckets and scrape-time gauges."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.observability.access_log import AccessRecord
from router.observability.metrics import (
    LATENCY_BUCKETS,
    MAX_LABEL_VALUES,
    OTHER,
    Metrics,
    RegionState,
    Telemetry,
)
from router.observability.slo import SloTargets, SloTracker

MS = 1_000_000


def record(**kw: object) -> AccessRecord:
    base: dict[str, object] = {
        "request_id": "r",
        "status": 200,
        "model": "m",
        "region": "eu",
        "cache": "miss",
        "stages": {"auth": MS // 10, "ttft": 50 * MS, "total": 80 * MS},
    }
    base.update(kw)
    return AccessRecord(**base)  # type: ignore[arg-type]


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_buckets_resolve_1ms_to_60s() -> None:
    assert LATENCY_BUCKETS[0] == 0.001
    assert LATENCY_BUCKETS[-1] == 60.0
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)
    assert 0.2 in LATENCY_BUCKETS  # the default TTFT objective is a bucket edge


def test_known_sequence_is_counted_exactly() -> None:
    m = Metrics()
    for _ in range(3):
        m.observe(record())
    m.observe(
        record(cache="hit", region=None, stages={"cache": MS, "ttft": 2 * MS, "total": 2 * MS})
    )
    m.observe(record(status=429, region=None, cache="none", stages={"total": MS}))
    m.observe(record(status=502, region="us", retries=2, failovers=1, hedges=1))
    labels = {"region": "eu", "model": "m", "status": "200", "cache": "miss"}
    assert sample(m, "router_requests_total", **labels) == 3
    assert sample(m, "router_ttft_seconds_count", **labels) == 3
    assert sample(m, "router_ttft_seconds_sum", **labels) == pytest.approx(0.150)
    # 50 ms TTFT lands in the 0.05 bucket, not the 0.02 one.
    assert sample(m, "router_ttft_seconds_bucket", **labels, le="0.02") == 0
    assert sample(m, "router_ttft_seconds_bucket", **labels, le="0.05") == 3
    assert sample(m, "router_request_duration_seconds_bucket", **labels, le="0.1") == 3
    hit = {"region": "none", "model": "m", "status": "200", "cache": "hit"}
    assert sample(m, "router_requests_total", **hit) == 1
    assert sample(m, "router_cache_hits_total") == 1
    assert sample(m, "router_cache_misses_total") == 4
    assert sample(m, "router_rate_limited_total") == 1
    assert sample(m, "router_server_errors_total", region="us") == 1
    assert sample(m, "router_retries_total") == 2
    assert sample(m, "router_failovers_total") == 1
    assert sample(m, "router_hedges_total") == 1
    assert sample(m, "router_stage_seconds_count", stage="auth") == 4
    assert sample(m, "router_stage_seconds_count", stage="cache") == 1
    assert sample(m, "router_stage_seconds_count", stage="total") == 6
    # 100 us auth needs the sub-millisecond stage buckets.
    assert sample(m, "router_stage_seconds_bucket", stage="auth", le="0.0001") == 4


def test_unbounded_model_names_fold_into_other() -> None:
    m = Metrics()
    for i in range(MAX_LABEL_VALUES + 10):
        m.observe(record(model=f"model-{i}"))
    labels = {"region": "eu", "status": "200", "cache": "miss"}
    assert sample(m, "router_requests_total", model="model-0", **labels) == 1
    assert sample(m, "router_requests_total", model=OTHER, **labels) == 10


def test_region_gauges_are_read_at_scrape_time() -> None:
    states = [RegionState("eu", True, 0.004, 3, 1, 0)]
    m = Metrics(regions=lambda: list(states))
    assert sample(m, "router_region_healthy", region="eu") == 1
    assert sample(m, "router_region_rtt_seconds", region="eu") == 0.004
    assert sample(m, "router_region_in_flight", region="eu") == 3
    assert sample(m, "router_region_queue_depth", region="eu") == 1
    states[0] = RegionState("eu", False, None, 0, 0, 2)
    assert sample(m, "router_region_healthy", region="eu") == 0
    assert sample(m, "router_region_rtt_seconds", region="eu") is None
    assert sample(m, "router_region_ejections_total", region="eu") == 2


def test_slo_compliance_in_metrics() -> None:
    now = [100.0]
    slo = SloTracker(SloTargets(ttft_p95_s=0.2, error_rate=0.1, window_s=60.0))
    m = Metrics(slo=slo, clock=lambda: now[0])
    for _ in range(10):
        m.observe(record(region="eu", stages={"ttft": 50 * MS, "total": 60 * MS}))
        m.observe(record(region="us", stages={"ttft": 400 * MS, "total": 500 * MS}))
    m.observe(record(region="us", status=503, stages={"total": MS}))
    assert sample(m, "router_slo_compliant", region="eu", objective="ttft_p95") == 1
    assert sample(m, "router_slo_compliant", region="us", objective="ttft_p95") == 0
    assert sample(m, "router_slo_compliant", region="us", objective="error_rate") == 1  # 1/11
    assert sample(m, "router_slo_compliant", region="all", objective="ttft_p95") == 0
    p95 = sample(m, "router_ttft_rolling_seconds", region="eu", quantile="0.95")
    assert p95 == pytest.approx(0.05, rel=0.01)
    assert sample(m, "router_error_rate_rolling", region="us") == pytest.approx(1 / 11)
    assert sample(m, "router_slo_ttft_p95_target_seconds") == 0.2
    now[0] += 120.0  # the window has passed: nothing to violate
    assert sample(m, "router_slo_compliant", region="us", objective="ttft_p95") == 1
    assert sample(m, "router_ttft_rolling_seconds", region="us", quantile="0.95") is None


def test_exposition_parses_and_registries_are_per_app() -> None:
    a, b = Telemetry(), Telemetry()
    a.finish(record())
    body, content_type = a.metrics.exposition()
    assert content_type.startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"router_requests", "router_ttft_seconds", "router_stage_seconds"} <= names
    assert sample(b.metrics, "router_requests_total", region="eu", model="m", status="200",
                  cache="miss") is None  # fmt: skip


def test_unknown_models_never_take_label_space() -> None:
    m = Metrics(models=["m"])
    m.observe(record(model="made-up"))
    m.observe(record(model="m"))
    labels = {"region": "eu", "status": "200", "cache": "miss"}
    assert sample(m, "router_requests_total", model=OTHER, **labels) == 1
    assert sample(m, "router_requests_total", model="m", **labels) == 1


def test_what_a_drain_ended_is_no_regions_failure() -> None:
    slo = SloTracker(SloTargets(window_s=60.0))
    m = Metrics(slo=slo, clock=lambda: 1.0)
    m.observe(record(status=503, region="eu", drained=True))
    m.observe(record(error="The router is shutting down; retry the request.", drained=True))
    m.observe(record(error="The region stopped mid-stream (idle)."))
    assert sample(m, "router_server_errors_total", region="eu") is None
    assert sample(m, "router_stream_failures_total", region="eu", model="m") == 1
    # Counted as requests; for the objectives only the region's own broken stream.
    assert (
        sample(m, "router_requests_total", region="eu", model="m", status="503", cache="miss") == 1
    )
    eu = slo.status("eu", 1.0)
    assert (eu.requests, eu.errors) == (1, 1)
