"""Canary tracking and automatic rollback, on an injected clock."""

from __future__ import annotations

import logging

import msgspec
import pytest

from router.config import CanaryConfig
from router.rollout.canary import CanaryMonitor, CanaryTracker, WindowStats, judge, p95
from router.rollout.table import Alias, Deployment, Rollout, RoutingTable


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def table(stable_weight: float = 95.0, canary_weight: float = 5.0) -> RoutingTable:
    return RoutingTable.build(
        [
            Alias(
                name="chat",
                deployments=(
                    Deployment("v1", "up-v1", weight=stable_weight),
                    Deployment("v2", "up-v2", weight=canary_weight),
                ),
                stable="v1",
            )
        ]
    )


POLICY = CanaryConfig(
    auto_rollback=True,
    window_s=60.0,
    min_samples=20,
    max_error_rate_delta=0.05,
    max_ttft_p95_ratio=2.0,
    check_interval_s=1.0,
)


def feed(
    target: CanaryTracker | CanaryMonitor,
    version: str,
    n: int,
    *,
    errors: int = 0,
    ttft: float = 0.1,
) -> None:
    for i in range(n):
        ok = i >= errors
        target.record("chat", version, ok=ok, ttft_s=ttft if ok else None)


def stats(
    samples: int, errors: int, p: float | None, ttft_samples: int | None = None
) -> WindowStats:
    return WindowStats(
        samples=samples,
        errors=errors,
        ttft_samples=samples - errors if ttft_samples is None else ttft_samples,
        ttft_p95=p,
    )


def test_p95_nearest_rank() -> None:
    assert p95([]) is None
    assert p95([3.0]) == 3.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([float(i) for i in range(20, 0, -1)]) == 19.0


def test_judge_needs_min_samples_on_both_sides() -> None:
    assert judge(POLICY, stats(19, 0, 0.1), stats(100, 100, None)) is None
    assert judge(POLICY, stats(100, 0, 0.1), stats(19, 19, None)) is None
    assert judge(POLICY, stats(20, 0, 0.1), stats(20, 20, None)) is not None


def test_judge_error_rate_delta_threshold() -> None:
    assert judge(POLICY, stats(100, 1, 0.1), stats(100, 6, 0.1)) is None  # delta 0.05, not over
    reason = judge(POLICY, stats(100, 1, 0.1), stats(100, 7, 0.1))
    assert reason is not None
    assert "error rate 0.070" in reason


def test_judge_ttft_ratio_threshold() -> None:
    assert judge(POLICY, stats(100, 0, 0.1), stats(100, 0, 0.2)) is None  # ratio 2.0, not over
    reason = judge(POLICY, stats(100, 0, 0.1), stats(100, 0, 0.25))
    assert reason is not None
    assert "TTFT p95 250.0ms" in reason


def test_judge_ttft_needs_an_absolute_difference_too() -> None:
    # Two fast versions: 3x slower but 2 ms apart is noise, not a worse canary.
    assert judge(POLICY, stats(100, 0, 0.001), stats(100, 0, 0.003)) is None
    assert judge(POLICY, stats(100, 0, 0.001), stats(100, 0, 0.0209)) is None
    assert judge(POLICY, stats(100, 0, 0.001), stats(100, 0, 0.021)) is not None
    lax = msgspec.structs.replace(POLICY, min_ttft_p95_delta_ms=0.0)
    assert judge(lax, stats(100, 0, 0.001), stats(100, 0, 0.003)) is not None


def test_judge_ttft_needs_min_ttft_samples() -> None:
    assert judge(POLICY, stats(100, 0, 0.1), stats(100, 0, 9.0, ttft_samples=5)) is None


def test_canary_better_than_stable_is_kept() -> None:
    assert judge(POLICY, stats(100, 10, 0.3), stats(100, 0, 0.1)) is None


def test_tracker_window_drops_old_samples() -> None:
    clock = Clock()
    tracker = CanaryTracker(POLICY, clock)
    feed(tracker, "v2", 30, errors=30)
    clock.now += 30
    feed(tracker, "v2", 10)
    assert tracker.stats("chat", "v2") == stats(40, 30, 0.1)
    clock.now += 31  # the first 30 are now older than 60 s
    assert tracker.stats("chat", "v2") == stats(10, 0, 0.1)


def test_tracker_caps_samples_per_version() -> None:
    tracker = CanaryTracker(CanaryConfig(max_samples=50), Clock())
    feed(tracker, "v1", 80, errors=30)
    assert tracker.stats("chat", "v1") == stats(50, 0, 0.1)


def test_tracker_unknown_version_is_empty() -> None:
    assert CanaryTracker(POLICY, Clock()).stats("chat", "v9") == stats(0, 0, None)


def test_evaluate_skips_zero_weight_canary_and_missing_stable() -> None:
    tracker = CanaryTracker(POLICY, Clock())
    feed(tracker, "v1", 50)
    feed(tracker, "v2", 50, errors=50)
    assert [v.canary for v in tracker.evaluate(table())] == ["v2"]
    assert tracker.evaluate(table(canary_weight=0.0)) == []
    assert tracker.evaluate(table(stable_weight=0.0)) == []


def test_monitor_rolls_back_worse_canary_and_logs_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    rollout = Rollout(table())
    monitor = CanaryMonitor(rollout, POLICY, clock)
    feed(monitor, "v1", 40)
    feed(monitor, "v2", 40, errors=10)
    assert rollout.table.alias("chat").weights() == {"v1": 95.0, "v2": 5.0}  # not yet due
    clock.now += 1.0
    with caplog.at_level(logging.WARNING, logger="router"):
        verdicts = monitor.record("chat", "v1", ok=True, ttft_s=0.1)
    assert [(v.alias, v.canary, v.stable) for v in verdicts] == [("chat", "v2", "v1")]
    assert rollout.table.alias("chat").weights() == {"v1": 95.0, "v2": 0.0}
    [line] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert line.name == "router"
    assert "canary rollback: model chat version v2" in line.getMessage()
    assert monitor.tracker.stats("chat", "v2").samples == 0  # a returning canary starts clean


def test_monitor_rolls_back_slow_canary() -> None:
    clock = Clock()
    rollout = Rollout(table())
    monitor = CanaryMonitor(rollout, POLICY, clock)
    feed(monitor, "v1", 40, ttft=0.1)
    feed(monitor, "v2", 40, ttft=0.5)
    clock.now += 1.0
    assert [v.canary for v in monitor.check()] == ["v2"]
    assert rollout.table.alias("chat").weights()["v2"] == 0.0


def test_monitor_without_auto_rollback_only_tracks() -> None:
    clock = Clock()
    rollout = Rollout(table())
    monitor = CanaryMonitor(rollout, CanaryConfig(auto_rollback=False, min_samples=5), clock)
    feed(monitor, "v1", 40)
    feed(monitor, "v2", 40, errors=40)
    clock.now += 5
    assert monitor.record("chat", "v2", ok=False, ttft_s=None) == []
    assert rollout.table.alias("chat").weights()["v2"] == 5.0
    assert monitor.tracker.stats("chat", "v2").errors == 41


def test_monitor_healthy_canary_keeps_its_weight() -> None:
    clock = Clock()
    rollout = Rollout(table())
    monitor = CanaryMonitor(rollout, POLICY, clock)
    feed(monitor, "v1", 100, errors=2)
    feed(monitor, "v2", 100, errors=3, ttft=0.15)
    clock.now += 2
    assert monitor.check() == []
    assert rollout.table.alias("chat").weights()["v2"] == 5.0


def test_streams_are_judged_by_ttft_apart_from_whole_answers() -> None:
    # Whole answers take seconds, streams start in 0.1 s; the canary's streams start 10x later.
    # One p95 over both kinds would be the whole answers' (equal in both) and see nothing.
    tracker = CanaryTracker(POLICY, Clock())
    for version, ttft in (("v1", 0.1), ("v2", 1.0)):
        for _ in range(30):
            tracker.record("chat", version, ok=True, ttft_s=ttft, stream=True)
        for _ in range(70):
            tracker.record("chat", version, ok=True, ttft_s=3.0, stream=False)
    stable, canary = tracker.stats("chat", "v1"), tracker.stats("chat", "v2")
    assert (canary.ttft_samples, canary.ttft_p95) == (30, 1.0)
    assert (canary.whole_samples, canary.whole_p95) == (70, 3.0)
    reason = judge(POLICY, stable, canary)
    assert reason is not None
    assert reason.startswith("TTFT p95 1000.0ms vs stable 100.0ms")


def test_whole_answers_are_judged_against_whole_answers() -> None:
    tracker = CanaryTracker(POLICY, Clock())
    for version, whole in (("v1", 1.0), ("v2", 5.0)):
        for _ in range(30):
            tracker.record("chat", version, ok=True, ttft_s=0.1, stream=True)
            tracker.record("chat", version, ok=True, ttft_s=whole, stream=False)
    reason = judge(POLICY, tracker.stats("chat", "v1"), tracker.stats("chat", "v2"))
    assert reason is not None
    assert reason.startswith("whole-answer p95 5000.0ms vs stable 1000.0ms")
    # Too few whole answers on one side: not compared (the streams are alike).
    few = CanaryTracker(POLICY, Clock())
    for version in ("v1", "v2"):
        for _ in range(30):
            few.record("chat", version, ok=True, ttft_s=0.1, stream=True)
    for _ in range(5):
        few.record("chat", "v2", ok=True, ttft_s=50.0, stream=False)
    assert judge(POLICY, few.stats("chat", "v1"), few.stats("chat", "v2")) is None
