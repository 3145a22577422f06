"""Retry budget: retries capped at min + ratio * requests over a sliding window."""

from __future__ import annotations

import pytest

from router.routing.budget import RetryBudget


def test_minimum_allows_retries_with_no_traffic() -> None:
    b = RetryBudget(ratio=0.2, min_retries=3, window_s=10)
    assert [b.try_retry(0.0) for _ in range(5)] == [True, True, True, False, False]


def test_ratio_of_requests_in_window() -> None:
    b = RetryBudget(ratio=0.2, min_retries=0, window_s=10)
    for _ in range(100):
        b.record_request(1.0)
    allowed = sum(b.try_retry(2.0) for _ in range(100))
    assert allowed == 20
    assert b.counts(2.0) == (100, 20)
    assert b.allowance(2.0) == pytest.approx(0.0)


def test_old_traffic_ages_out_of_the_window() -> None:
    b = RetryBudget(ratio=0.5, min_retries=0, window_s=10, buckets=10)
    for _ in range(10):
        b.record_request(0.5)
    assert sum(b.try_retry(0.6) for _ in range(10)) == 5
    # 9.9 s later the bucket at t=0.5 is still in the window; at 10.5 it is gone.
    assert b.counts(9.9) == (10, 5)
    assert b.counts(10.5) == (0, 0)
    assert not b.try_retry(10.5)
    for _ in range(4):
        b.record_request(10.6)
    assert sum(b.try_retry(10.7) for _ in range(4)) == 2


def test_long_gap_clears_everything() -> None:
    b = RetryBudget(ratio=1.0, min_retries=1, window_s=1, buckets=4)
    for _ in range(50):
        b.record_request(0.0)
    assert b.counts(1000.0) == (0, 0)
    assert b.try_retry(1000.0)
    assert not b.try_retry(1000.0)


def test_storm_is_bounded_when_every_attempt_fails() -> None:
    b = RetryBudget(ratio=0.2, min_retries=10, window_s=10)
    retries = 0
    for i in range(1000):
        now = i * 0.005  # 1000 requests in 5 s, all within one window
        b.record_request(now)
        # Each request would like two retries.
        retries += b.try_retry(now) + b.try_retry(now)
    assert retries == 10 + 200


def test_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="ratio"):
        RetryBudget(ratio=-1)
    with pytest.raises(ValueError, match="window_s"):
        RetryBudget(window_s=0)
