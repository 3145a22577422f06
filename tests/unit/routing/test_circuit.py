"""Circuits per (region, model), on a clock of the test's own."""

from __future__ import annotations

import pytest

from router.routing.circuit import Circuits


def test_opens_after_consecutive_failures_and_a_success_closes_it() -> None:
    c = Circuits(failures_to_open=3, base_s=5.0, max_s=30.0)
    assert c.closed("a", "m", 0.0)
    assert not c.record("a", "m", False, 0.0)
    assert not c.record("a", "m", False, 1.0)
    assert c.record("a", "m", False, 2.0)  # the third opens it
    assert not c.closed("a", "m", 3.0)
    assert c.closed("a", "other-model", 3.0)  # per model: the region's other models go on
    assert c.closed("b", "m", 3.0)
    assert c.open_pairs(3.0) == [("a", "m", 4.0)]
    assert c.closed("a", "m", 7.0)  # due: one trial
    assert not c.closed("a", "m", 7.0)  # and only one at a time
    c.record("a", "m", True, 7.5)
    assert c.closed("a", "m", 7.6)
    assert c.open_pairs(8.0) == []


def test_a_failed_trial_opens_it_for_longer_up_to_the_cap() -> None:
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=12.0)
    c.record("a", "m", False, 0.0)
    opened_for = []
    now = 0.0
    for _ in range(4):
        until = now + c.open_pairs(now)[0][2]
        opened_for.append(until - now)
        now = until
        assert c.closed("a", "m", now)
        c.record("a", "m", False, now)
    assert opened_for == [5.0, 10.0, 12.0, 12.0]


def test_primary_down_for_a_minute_then_back() -> None:
    """Issue 23's case: a primary answers 503 for 60 s, then recovers; a request every 4 s
    tries the primary first while its circuit is closed (or due a trial)."""
    c = Circuits()  # the [routing] defaults: 3 failures, 5 s, at most 30 s
    reached_while_down = 0
    first_back = None
    for i in range(30):
        now = 4.0 * i
        down = now < 60.0
        if c.closed("primary", "m", now):
            c.record("primary", "m", not down, now)
            if down:
                reached_while_down += 1
            elif first_back is None:
                first_back = now
        # else: served from elsewhere, the primary not even asked
    assert reached_while_down <= 6  # of 15 requests while it was down: a circuit, not a retry
    assert first_back is not None
    assert first_back - 60.0 <= 30.0


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="failures_to_open"):
        Circuits(failures_to_open=0)


def test_a_hold_sends_the_pair_last_until_it_runs_out_and_counts_no_failure() -> None:
    circuits = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    circuits.hold("a", "m", 2.0, now=0.0)
    assert not circuits.closed("a", "m", now=1.9)
    assert circuits.closed("a", "m", now=2.0)
    # Ran out: as before it, not a half-open trial (one failure now opens it for base_s only).
    assert circuits.closed("a", "m", now=2.1)
    assert circuits.record("a", "m", ok=False, now=3.0)
    assert [round(left) for *_, left in circuits.open_pairs(3.0)] == [5]
    # At most max_s, whatever the region asked.
    circuits.hold("b", "m", 3600.0, now=0.0)
    assert [round(left) for r, _, left in circuits.open_pairs(0.0) if r == "b"] == [30]
