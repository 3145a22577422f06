"""The quantile sketch against exact quantiles, within its relative-error guarantee."""

from __future__ import annotations

import random

import pytest

from router.observability.quantiles import OVERALL, QuantileBoard, RollingSketch, Sketch

QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


def exact(values: list[float], q: float) -> float:
    """The element the sketch's rank rule points at: sorted[floor(q * (n - 1))]."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def assert_within(sketch: Sketch, values: list[float]) -> None:
    for q in QS:
        got = sketch.quantile(q)
        want = exact(values, q)
        assert got is not None
        assert abs(got - want) <= sketch.alpha * want + 1e-12, (q, got, want)


@pytest.mark.parametrize(
    "draw",
    [
        lambda r: r.lognormvariate(-3.0, 1.0),  # latency-like, heavy right tail
        lambda r: r.uniform(0.001, 60.0),
        lambda r: r.expovariate(20.0) + 1e-6,
        lambda r: r.paretovariate(1.5) / 1000.0,
    ],
    ids=["lognormal", "uniform", "exponential", "pareto"],
)
@pytest.mark.parametrize("alpha", [0.01, 0.02, 0.05])
def test_quantiles_within_relative_error(draw: object, alpha: float) -> None:
    rng = random.Random(7)
    values = [draw(rng) for _ in range(20_000)]  # type: ignore[operator]
    sketch = Sketch(alpha)
    for v in values:
        sketch.add(v)
    assert sketch.count == len(values)
    assert_within(sketch, values)


def test_memory_is_bounded_by_max_bins() -> None:
    rng = random.Random(1)
    sketch = Sketch(0.01, max_bins=128)
    values = [10 ** rng.uniform(-6, 3) for _ in range(10_000)]
    for v in values:
        sketch.add(v)
    assert sketch.bins <= 128
    # Collapsing folds the lowest buckets, so the high quantiles keep their guarantee.
    for q in (0.9, 0.99, 1.0):
        got = sketch.quantile(q)
        assert got is not None
        assert abs(got - exact(values, q)) <= 0.01 * exact(values, q)


def test_latency_range_needs_few_bins() -> None:
    sketch = Sketch(0.01)
    v = 0.0001
    while v < 60.0:
        sketch.add(v)
        v *= 1.001
    # 100 us to 60 s at 1% needs ~670 log buckets, well under the default cap.
    assert 600 < sketch.bins < 700


def test_zero_and_empty() -> None:
    sketch = Sketch()
    assert sketch.quantile(0.5) is None
    sketch.add(0.0)
    sketch.add(0.0)
    sketch.add(1.0)
    assert sketch.quantile(0.0) == 0.0
    assert sketch.quantile(0.5) == 0.0
    got = sketch.quantile(1.0)
    assert got is not None
    assert abs(got - 1.0) <= 0.01


def test_merge_equals_one_sketch() -> None:
    rng = random.Random(3)
    values = [rng.lognormvariate(0, 2) for _ in range(5000)]
    a, b, whole = Sketch(), Sketch(), Sketch()
    for i, v in enumerate(values):
        (a if i % 2 else b).add(v)
        whole.add(v)
    a.merge(b)
    assert a.count == whole.count
    assert a.quantiles(QS) == whole.quantiles(QS)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="alpha"):
        Sketch(1.5)
    with pytest.raises(ValueError, match="quantile"):
        Sketch().quantile(1.5)
    with pytest.raises(ValueError, match="different alpha"):
        Sketch(0.01).merge(Sketch(0.02))


def test_rolling_window_forgets_old_values() -> None:
    rolling = RollingSketch(window_s=60.0, slots=6)
    for i in range(100):
        rolling.add(1.0, now=5.0 + i * 0.01)  # all in the first 10 s slot
    p50 = rolling.quantiles([0.5], now=30.0)[0]
    assert p50 is not None
    assert abs(p50 - 1.0) <= 0.01
    rolling.add(0.010, now=65.0)
    # At 65 s the first slot [0, 10) has left the window; only the new value remains.
    window = rolling.window(65.0)
    assert window.count == 1
    got = window.quantile(0.5)
    assert got is not None
    assert abs(got - 0.010) <= 0.01 * 0.010
    assert rolling.window(200.0).count == 0


def test_rolling_matches_exact_over_window() -> None:
    rng = random.Random(11)
    rolling = RollingSketch(window_s=10.0, slots=10)
    timed = [(t / 100, rng.lognormvariate(-4, 1)) for t in range(3000)]  # 0 .. 29.99 s
    for now, v in timed:
        rolling.add(v, now)
    now = timed[-1][0]
    # 1 s slots: at 29.99 the window is the ten slots [20, 30).
    kept = [v for t, v in timed if t >= 20.0]
    window = rolling.window(now)
    assert window.count == len(kept)
    assert_within(window, kept)


def test_board_tracks_keys_and_overall() -> None:
    board = QuantileBoard(window_s=60.0)
    for _ in range(10):
        board.add("eu", 0.1, now=1.0)
        board.add("us", 0.3, now=1.0)
    assert list(board.keys()) == [OVERALL, "eu", "us"]
    eu = board.quantiles("eu", [0.5], 2.0)[0]
    us = board.quantiles("us", [0.99], 2.0)[0]
    overall = board.quantiles(OVERALL, [0.0, 1.0], 2.0)
    assert eu == pytest.approx(0.1, rel=0.01)
    assert us == pytest.approx(0.3, rel=0.01)
    assert overall[0] == pytest.approx(0.1, rel=0.01)
    assert overall[1] == pytest.approx(0.3, rel=0.01)
    assert board.quantiles("ap", [0.5], 2.0) == [None]


def test_quantiles_agree_with_quantile() -> None:
    rng = random.Random(5)
    sketch = Sketch()
    for _ in range(3000):
        sketch.add(rng.lognormvariate(-3, 1.5))
    sketch.add(0.0)
    assert sketch.quantiles(QS) == [sketch.quantile(q) for q in QS]
    assert Sketch().quantiles([0.5, 0.9]) == [None, None]
    with pytest.raises(ValueError, match="quantile"):
        sketch.quantiles([2.0])
