"""The pure arithmetic of leased global limits: slice sizing, returns, rate estimate, the bound."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How an instance sizes the slices of a key's global budget it holds (see docs/LIMITS.md)."""

    # A slice covers this long at the key's recent local rate (Doorman's lease refresh horizon).
    horizon_s: float = 1.0
    # ... and never more than this fraction of the key's global burst.
    max_fraction: float = 0.25
    # Before its first lease answer for a key, an instance admits this fraction of the key's
    # burst (at least one) on credit; what it admitted is charged to the global bucket after.
    credit_fraction: float = 0.05
    # Weight of the newest interval in the rate estimate.
    alpha: float = 0.5


def max_slice(policy: LeasePolicy, capacity: float) -> float:
    """The most one instance holds of a bucket with this global capacity (at least one unit)."""
    return max(1.0, math.floor(capacity * policy.max_fraction))


def credit(policy: LeasePolicy, capacity: float) -> int:
    """Units admitted on credit before the first lease answer (at least one)."""
    return max(1, math.floor(capacity * policy.credit_fraction))


def target(policy: LeasePolicy, rate_per_s: float, capacity: float, floor: float) -> float:
    """What an instance should hold: its recent rate over the horizon, within [floor, max_slice]
    (the floor, one request or the largest reservation seen, wins over max_slice)."""
    top = max(max_slice(policy, capacity), floor)
    return min(top, max(floor, math.ceil(rate_per_s * policy.horizon_s)))


def want(held: float, goal: float) -> float:
    """How much to ask for to top `held` up to `goal` (whole units, never negative)."""
    return float(max(0, math.ceil(goal - held)))


def excess(held: float, goal: float, *, idle: bool) -> float:
    """How much to give back: everything when idle, the surplus over `goal` when holding more
    than twice it (hysteresis, so a key at a steady rate does not bounce units back and forth)."""
    if held <= 0:
        return 0.0
    if idle:
        return float(math.floor(held))
    if held > 2 * goal:
        return float(math.floor(held - goal))
    return 0.0


def next_rate(previous: float, demand: float, elapsed_s: float, alpha: float) -> float:
    """Exponentially weighted demand per second (requests wanted, admitted or not)."""
    if elapsed_s <= 0:
        return previous
    return alpha * (demand / elapsed_s) + (1 - alpha) * previous


@dataclass(frozen=True, slots=True)
class Bound:
    """How far N instances can admit beyond one exact global bucket."""

    # Units (requests or tokens) admitted beyond capacity + rate * window, over any window, once.
    extra: float
    # The same as seconds of the global rate.
    extra_s: float


def accuracy_bound(policy: LeasePolicy, instances: int, capacity: float, per_s: float) -> Bound:
    """The documented bound: each instance may hold one slice the global bucket has already
    refilled behind, plus its first-lease credit (charged later, so the long-run rate is exact)."""
    extra = instances * (max_slice(policy, capacity) + credit(policy, capacity))
    return Bound(extra=extra, extra_s=extra / per_s if per_s > 0 else math.inf)
