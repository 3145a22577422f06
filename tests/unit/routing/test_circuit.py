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


def _due(c: Circuits, now: float = 0.0) -> float:
    """Open a's circuit for m (one failure opens it) and return when its trial is due."""
    assert c.record("a", "m", False, now)
    return now + c.open_pairs(now)[0][2]


def test_a_trial_that_succeeds_closes_the_circuit() -> None:
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    due = _due(c)
    assert c.closed("a", "m", due, "r1")
    assert not c.closed("a", "m", due + 1.0, "r2")  # one trial at a time
    assert not c.record("a", "m", True, due + 1.0)
    assert c.closed("a", "m", due + 1.0, "r2")
    assert c.open_pairs(due + 1.0) == []


def test_a_trial_answered_with_an_error_opens_it_again_for_longer() -> None:
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    due = _due(c)
    assert c.closed("a", "m", due, "r1")
    assert c.record("a", "m", False, due + 1.0)
    assert c.open_pairs(due + 1.0) == [("a", "m", 10.0)]
    assert not c.closed("a", "m", due + 10.9, "r2")
    assert c.closed("a", "m", due + 11.0, "r2")


@pytest.mark.parametrize("silent_for", [0.0, 29.0])
def test_a_trial_that_times_out_or_cannot_connect_opens_it_again_for_longer(
    silent_for: float,
) -> None:
    """No first byte (or no connection) is the region's failure: the trial failed."""
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    due = _due(c)
    assert c.closed("a", "m", due, "r1")
    assert c.unreached("a", "m", due + silent_for)
    assert c.open_pairs(due + silent_for) == [("a", "m", 10.0)]
    assert not c.closed("a", "m", due + silent_for + 1.0, "r2")


def test_unreached_counts_nothing_against_a_closed_or_open_circuit() -> None:
    """Reachability is the region's health (ejection), not the model's circuit."""
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    assert not c.unreached("a", "m", 0.0)
    assert c.closed("a", "m", 0.0)
    assert c.record("a", "m", False, 0.0)
    assert not c.unreached("a", "m", 1.0)  # open: not due, nothing changes
    assert c.open_pairs(1.0) == [("a", "m", 4.0)]


@pytest.mark.parametrize("ending", ["cancelled", "request's fault", "spill", "never sent"])
def test_a_trial_that_ends_saying_nothing_of_the_region_is_given_back(ending: str) -> None:
    """The client left, the request was at fault, admission spilled it, or it was served
    elsewhere first: the next request takes the trial at once, and the backoff is unchanged."""
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    due = _due(c)
    assert c.closed("a", "m", due, "r1")
    assert not c.closed("a", "m", due + 1.0, "r2")
    if ending == "never sent":
        c.release("r1")  # the request's end: every trial it still holds
    else:
        c.release("r1", "a", "m")
    assert c.closed("a", "m", due + 1.0, "r2")
    assert c.record("a", "m", False, due + 2.0)
    assert c.open_pairs(due + 2.0) == [("a", "m", 10.0)]  # its second opening, not its third


def test_only_the_holder_gives_a_trial_back() -> None:
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    due = _due(c)
    assert c.closed("a", "m", due, "r1")
    c.release("r2")
    c.release("r2", "a", "m")
    c.release("r1", "b", "m")
    c.release("r1", "a", "other-model")
    assert not c.closed("a", "m", due + 1.0, "r3")


def test_a_trial_never_heard_of_again_lapses_after_max_s() -> None:
    """Whatever became of it (a bug, a path that never reports), the pair is not shut out."""
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    due = _due(c)
    assert c.closed("a", "m", due, "lost")
    assert not c.closed("a", "m", due + 29.9, "r2")
    assert c.closed("a", "m", due + 30.0, "r2")
    assert not c.closed("a", "m", due + 30.0, "r3")
    # The lost trial's late outcome still counts: a success closes the circuit.
    c.record("a", "m", True, due + 31.0)
    assert c.closed("a", "m", due + 31.0, "r3")


def test_a_broken_stream_on_trial_opens_it_again() -> None:
    """A stream's trial settles when it ends: broken after its first byte is a failure."""
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    due = _due(c)
    assert c.closed("a", "m", due, "r1")
    # Its first byte settles nothing yet; 60 s later (past the lease) it breaks.
    assert c.closed("a", "m", due + 30.0, "r2")  # the lease lapsed: another may try
    assert c.record("a", "m", False, due + 60.0)
    assert not c.closed("a", "m", due + 60.0, "r3")
    c.release("r1")  # r1's end gives back nothing any more (the failure settled it)
    assert not c.closed("a", "m", due + 61.0, "r3")


def test_a_hold_during_a_trial_ends_it_and_counts_no_failure() -> None:
    """A trial answered 503 with Retry-After: the pair waits that long, then is tried again;
    the opening count is not raised."""
    c = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    due = _due(c)
    assert c.closed("a", "m", due, "r1")
    c.hold("a", "m", 2.0, due + 1.0)
    assert not c.closed("a", "m", due + 2.9, "r2")
    assert c.closed("a", "m", due + 3.0, "r2")  # a trial again
    assert not c.closed("a", "m", due + 3.0, "r3")
    assert c.record("a", "m", False, due + 4.0)
    assert c.open_pairs(due + 4.0) == [("a", "m", 10.0)]  # its second opening
