"""Rolling SLO figures: error rate and TTFT quantiles per region against the targets."""

from __future__ import annotations

import pytest

from router.observability.quantiles import OVERALL
from router.observability.slo import RollingCounts, SloTargets, SloTracker, is_error


def test_errors_are_5xx_only() -> None:
    assert is_error(500)
    assert is_error(503)
    assert not is_error(429)
    assert not is_error(404)


def test_rolling_counts_forget_after_the_window() -> None:
    counts = RollingCounts(window_s=10.0, slots=10)
    for i in range(10):
        counts.add(i % 2 == 0, now=float(i))
    assert counts.totals(9.5) == (10, 5)
    assert counts.totals(14.5) == (5, 2)  # slots 5..9 remain: errors at 6 and 8
    assert counts.totals(100.0) == (0, 0)


def test_compliance_per_region_and_overall() -> None:
    slo = SloTracker(SloTargets(ttft_p95_s=0.2, error_rate=0.001, window_s=60.0))
    for _ in range(1000):
        slo.observe("eu", 200, 0.05, now=1.0)
    slo.observe("eu", 500, None, now=1.0)
    for _ in range(100):
        slo.observe("us", 200, 0.3, now=1.0)
    slo.observe(None, 200, 0.001, now=1.0)  # a cache hit: overall only
    eu = slo.status("eu", 2.0)
    assert (eu.requests, eu.errors) == (1001, 1)
    assert eu.ttft_p95_s == pytest.approx(0.05, rel=0.01)
    assert eu.ttft_ok
    assert eu.errors_ok  # 1/1001 < 0.1%
    us = slo.status("us", 2.0)
    assert not us.ttft_ok
    assert not us.ok
    overall = slo.status(OVERALL, 2.0)
    assert overall.requests == 1102
    assert overall.ttft_p50_s == pytest.approx(0.05, rel=0.01)
    assert slo.names() == [OVERALL, "eu", "us"]
    slo.observe("eu", 502, None, now=2.0)
    assert not slo.status("eu", 2.0).errors_ok  # 2/1002 > 0.1%


def test_no_traffic_meets_the_objectives() -> None:
    st = SloTracker().status("nowhere", 0.0)
    assert st.ok
    assert st.error_rate is None
    assert st.ttft_p95_s is None


def test_a_flood_of_client_errors_cannot_make_the_objectives_look_met() -> None:
    slo = SloTracker(SloTargets(ttft_p95_s=0.2, error_rate=0.1, window_s=60.0))
    for _ in range(40):
        slo.observe("eu", 200, 0.4, 1.0)
    slo.observe("eu", 502, None, 1.0)
    for status in (401, 404, 415, 429, 499):
        for _ in range(200):
            slo.observe(None, status, 0.001, 1.0)
    overall = slo.status(OVERALL, 1.0)
    assert (overall.requests, overall.errors) == (41, 1)
    assert overall.ttft_p95_s == pytest.approx(0.4, rel=0.02)
    assert not overall.ttft_ok


def test_a_broken_stream_is_an_error_despite_its_200() -> None:
    slo = SloTracker(SloTargets(error_rate=0.1, window_s=60.0))
    slo.observe("eu", 200, 0.05, 1.0)
    slo.observe("eu", 200, 0.05, 1.0, broken=True)
    eu = slo.status("eu", 1.0)
    assert (eu.requests, eu.errors, eu.errors_ok) == (2, 1, False)


def test_a_regions_429_passed_on_is_an_error_the_routers_own_is_not() -> None:
    slo = SloTracker(SloTargets(error_rate=0.1, window_s=60.0))
    slo.observe("eu", 200, 0.05, 1.0)
    slo.observe("eu", 429, None, 1.0)  # every region full: the region's 429 passed on
    slo.observe(None, 429, None, 1.0)  # the key over its own limit
    overall = slo.status(OVERALL, 1.0)
    assert (overall.requests, overall.errors) == (2, 1)
    assert slo.status("eu", 1.0).errors == 1
