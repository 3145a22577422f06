"""Rollout assignment properties: one weight change moves keys only to or from that version."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.rollout.table import Alias, Deployment, assign

KEYS = [f"k{i}" for i in range(200)]
weights = st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=2, max_size=5).filter(
    lambda ws: sum(ws) > 0
)


def alias(ws: list[float]) -> Alias:
    return Alias(
        "m", tuple(Deployment(f"v{i}", f"up{i}", weight=w) for i, w in enumerate(ws)), stable="v0"
    )


@settings(max_examples=40, deadline=None)
@given(ws=weights, index=st.integers(min_value=0, max_value=4), new=st.floats(0.0, 100.0))
def test_changing_one_weight_moves_keys_only_to_or_from_it(
    ws: list[float], index: int, new: float
) -> None:
    index %= len(ws)
    changed = list(ws)
    changed[index] = new
    if sum(changed) <= 0:
        return
    target = f"v{index}"
    before, after = alias(ws), alias(changed)
    for key in KEYS:
        was, now = assign(before, key).version, assign(after, key).version
        if was != now:
            # growing a weight only pulls keys in; shrinking it only lets keys out
            assert (now == target and new > ws[index]) or (was == target and new < ws[index])


@settings(max_examples=40, deadline=None)
@given(ws=weights)
def test_zero_weight_never_assigned_and_assignment_is_deterministic(ws: list[float]) -> None:
    a = alias(ws)
    for key in KEYS:
        d = assign(a, key)
        assert d.weight > 0
        assert assign(alias(ws), key) == d
