"""The leasing arithmetic of global limits: slice sizing, give-backs, rate estimate, the bound."""

from __future__ import annotations

import math

import pytest

from router.access.leasing import (
    LeasePolicy,
    accuracy_bound,
    credit,
    excess,
    max_slice,
    next_rate,
    target,
    want,
)

POLICY = LeasePolicy(horizon_s=1.0, max_fraction=0.25, credit_fraction=0.05, alpha=0.5)


def test_slice_follows_the_local_rate_within_its_limits() -> None:
    # 10 req/s over a 1 s horizon, of a 1000 burst: 10.
    assert target(POLICY, 10.0, 1000, 1.0) == 10
    # An idle key still holds the floor (one request) ...
    assert target(POLICY, 0.0, 1000, 1.0) == 1
    # ... a busy one at most a quarter of the burst.
    assert target(POLICY, 5000.0, 1000, 1.0) == 250
    # A reservation larger than the cap is the floor: a slice that cannot fit it is useless.
    assert target(POLICY, 0.0, 1000, 810.0) == 810


def test_tiny_buckets_still_lease_one_unit() -> None:
    assert max_slice(POLICY, 3) == 1
    assert credit(POLICY, 3) == 1
    assert credit(POLICY, 1000) == 50


def test_want_tops_up_and_never_goes_negative() -> None:
    assert want(0, 10) == 10
    assert want(3.5, 10) == 7
    assert want(12, 10) == 0


def test_surplus_goes_back_with_hysteresis_and_all_of_it_when_idle() -> None:
    assert excess(15, 10, idle=False) == 0  # within twice the goal: kept
    assert excess(25, 10, idle=False) == 15  # back down to the goal
    assert excess(7.9, 10, idle=True) == 7
    assert excess(-3, 10, idle=True) == 0  # a debt is not given back


def test_rate_estimate_is_an_ewma_of_demand() -> None:
    assert next_rate(0.0, 10, 1.0, 0.5) == 5.0
    assert next_rate(5.0, 10, 1.0, 0.5) == 7.5
    assert next_rate(5.0, 10, 0.0, 0.5) == 5.0  # no time passed: unchanged
    rate = 0.0
    for _ in range(30):
        rate = next_rate(rate, 20, 0.25, 0.5)
    assert rate == pytest.approx(80.0)


@pytest.mark.parametrize("instances", [1, 3, 10])
def test_accuracy_bound_is_one_slice_and_one_credit_per_instance(instances: int) -> None:
    bound = accuracy_bound(POLICY, instances, capacity=600, per_s=10)
    assert bound.extra == instances * (150 + 30)
    assert bound.extra_s == pytest.approx(bound.extra / 10)
    assert math.isinf(accuracy_bound(POLICY, 3, 600, 0).extra_s)


def test_tighter_policy_tightens_the_bound() -> None:
    tight = LeasePolicy(max_fraction=0.05, credit_fraction=0.0)
    assert accuracy_bound(tight, 3, 600, 10).extra < accuracy_bound(POLICY, 3, 600, 10).extra
