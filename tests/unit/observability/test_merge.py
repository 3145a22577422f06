"""Workers' views merged into the machine's: counters summed, shared facts kept per worker."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from router.observability.merge import merge_metrics, merge_status, monotonic_only

W0 = """# HELP router_requests_total Finished requests.
# TYPE router_requests_total counter
router_requests_total{region="a",status="200"} 3.0
# HELP router_ttft_seconds TTFT.
# TYPE router_ttft_seconds histogram
router_ttft_seconds_bucket{le="0.1"} 2.0
router_ttft_seconds_bucket{le="+Inf"} 3.0
router_ttft_seconds_count{} 3.0
router_ttft_seconds_sum 0.25
# HELP router_region_healthy 1 if the region takes traffic.
# TYPE router_region_healthy gauge
router_region_healthy{region="a"} 1.0
# HELP router_region_in_flight In flight.
# TYPE router_region_in_flight gauge
router_region_in_flight{region="a"} 2.0
# HELP router_build_info What runs.
# TYPE router_build_info gauge
router_build_info{commit="abc",version="0.1.0"} 1.0
# HELP process_start_time_seconds Start.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e9
"""
W1 = W0.replace("} 3.0", "} 4.0").replace(
    'router_region_healthy{region="a"} 1.0', 'router_region_healthy{region="a"} 0.0'
)


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_and_histograms_add_up() -> None:
    m = _samples(merge_metrics([W0, W1]))
    assert m[("router_requests_total", frozenset({("region", "a"), ("status", "200")}))] == 7
    assert m[("router_ttft_seconds_count", frozenset())] == 7
    assert m[("router_ttft_seconds_bucket", frozenset({("le", "0.1")}))] == 4
    assert m[("router_ttft_seconds_sum", frozenset())] == 0.5
    assert m[("router_region_in_flight", frozenset({("region", "a")}))] == 4


def test_views_stay_per_worker_and_identical_facts_once() -> None:
    m = _samples(merge_metrics([W0, W1]))
    assert m[("router_region_healthy", frozenset({("region", "a"), ("worker", "0")}))] == 1
    assert m[("router_region_healthy", frozenset({("region", "a"), ("worker", "1")}))] == 0
    info = [k for k in m if k[0] == "router_build_info"]
    assert len(info) == 1
    assert not [k for k in m if k[0] == "process_start_time_seconds"]


def test_status_feeds_merge() -> None:
    def feed(requests: int, healthy: bool, p95: float) -> dict[str, object]:
        slo = {"requests": requests, "errors": 1, "ttft_p95_ms": p95, "ttft_ok": True}
        return {
            "ts": 1.0,
            "overall": slo,
            "cache": {"hits": requests, "misses": 1},
            "rate_limited": 2,
            "regions": [{"name": "a", "healthy": healthy, "in_flight": 1, **slo}],
        }

    merged = merge_status([feed(10, True, 5.0), feed(30, False, 9.0)], workers=2)
    assert merged["workers"] == 2
    assert merged["overall"]["requests"] == 40
    assert merged["overall"]["error_rate"] == 2 / 40
    assert merged["overall"]["ttft_p95_ms"] == 9.0
    assert merged["cache"]["hits"] == 40
    assert merged["rate_limited"] == 4
    (region,) = merged["regions"]
    assert region["healthy"] is False
    assert region["in_flight"] == 2


def test_monotonic_only_keeps_counters_and_histograms_not_gauges() -> None:
    text = (
        "# HELP router_requests_total Finished requests.\n"
        "# TYPE router_requests_total counter\n"
        'router_requests_total{region="a"} 3.0\n'
        "# HELP router_region_in_flight In flight.\n"
        "# TYPE router_region_in_flight gauge\n"
        'router_region_in_flight{region="a"} 2.0\n'
        "# HELP router_ttft_seconds TTFT.\n"
        "# TYPE router_ttft_seconds histogram\n"
        'router_ttft_seconds_bucket{le="+Inf"} 3.0\n'
        "router_ttft_seconds_count 3.0\n"
        "router_ttft_seconds_sum 0.5\n"
    )
    kept = monotonic_only(text)
    assert "router_region_in_flight" not in kept
    merged = merge_metrics([kept, text])
    assert 'router_requests_total{region="a"} 6.0' in merged
    assert "router_ttft_seconds_count 6.0" in merged
    assert 'router_region_in_flight{region="a"} 2.0' in merged  # the live worker's only
    # Re-read, every family keeps its type (TYPE lines name counters with their `_total`).
    types = {f.name: f.type for f in text_string_to_metric_families(merged)}
    assert types == {
        "router_requests": "counter",
        "router_ttft_seconds": "histogram",
        "router_region_in_flight": "gauge",
    }
    assert monotonic_only("") == ""


def test_a_counter_read_from_the_machines_tables_is_the_machines_not_a_sum() -> None:
    # Every worker reports the one prober's ejections: 3 is the machine's count, not 3 x 3,
    # and a dead worker's copy is not kept on top.
    text = (
        "# HELP router_region_ejections_total Times the region was ejected.\n"
        "# TYPE router_region_ejections_total counter\n"
        'router_region_ejections_total{region="a"} 3.0\n'
    )
    merged = merge_metrics([text, text, monotonic_only(text)])
    assert 'router_region_ejections_total{region="a"} 3.0' in merged
    assert monotonic_only(text) == ""
