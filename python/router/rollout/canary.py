"""Per-version error rate and latency over a rolling window; automatic rollback of a worse canary.

Latency is judged per kind: streams by their time to first token, whole answers by their time to
the whole answer, each version against stable's of the same kind (a p95 over both kinds would
be the whole answers' and hide a canary whose streams start late)."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from router.config import CanaryConfig
from router.rollout.table import Rollout, RoutingTable

log = logging.getLogger("router")


@dataclass(frozen=True, slots=True)
class WindowStats:
    """One version's outcomes inside the window."""

    samples: int
    errors: int
    ttft_samples: int  # streams answered (first token came)
    ttft_p95: float | None
    whole_samples: int = 0  # whole answers
    whole_p95: float | None = None

    @property
    def error_rate(self) -> float:
        """Errors over samples; 0 when there are none."""
        return self.errors / self.samples if self.samples else 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """A canary judged worse than the stable version, and why."""

    alias: str
    canary: str
    stable: str
    reason: str
    canary_stats: WindowStats
    stable_stats: WindowStats


def p95(values: list[float]) -> float | None:
    """Nearest-rank 95th percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class VersionWindow:
    """Timestamped outcomes of one (alias, version), bounded in age and count."""

    def __init__(self, max_samples: int) -> None:
        self._samples: deque[tuple[float, bool, float | None, bool]] = deque(maxlen=max_samples)

    def add(self, now: float, ok: bool, ttft_s: float | None, stream: bool = True) -> None:
        """Record one request's outcome; `ttft_s` is a stream's time to first token, or a whole
        answer's time when not `stream`."""
        self._samples.append((now, ok, ttft_s, stream))

    def stats(self, now: float, window_s: float) -> WindowStats:
        """Drop samples older than the window, summarize the rest."""
        horizon = now - window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        errors = sum(1 for _, ok, _, _ in self._samples if not ok)
        ttfts: list[float] = []
        wholes: list[float] = []
        for _, ok, t, stream in self._samples:
            if ok and t is not None:
                (ttfts if stream else wholes).append(t)
        return WindowStats(
            samples=len(self._samples),
            errors=errors,
            ttft_samples=len(ttfts),
            ttft_p95=p95(ttfts),
            whole_samples=len(wholes),
            whole_p95=p95(wholes),
        )


def judge(policy: CanaryConfig, stable: WindowStats, canary: WindowStats) -> str | None:
    """Why the canary is worse than stable beyond the policy's thresholds, or None."""
    if min(stable.samples, canary.samples) < policy.min_samples:
        return None
    delta = canary.error_rate - stable.error_rate
    if delta > policy.max_error_rate_delta:
        return (
            f"error rate {canary.error_rate:.3f} vs stable {stable.error_rate:.3f} "
            f"(delta {delta:.3f} > {policy.max_error_rate_delta})"
        )
    s, c = stable, canary
    kinds = (
        ("TTFT", s.ttft_samples, s.ttft_p95, c.ttft_samples, c.ttft_p95),
        ("whole-answer", s.whole_samples, s.whole_p95, c.whole_samples, c.whole_p95),
    )
    for what, stable_n, stable_p95, canary_n, canary_p95 in kinds:
        if min(stable_n, canary_n) < policy.min_samples:
            continue
        if stable_p95 is None or canary_p95 is None or stable_p95 <= 0:
            continue
        ratio = canary_p95 / stable_p95
        slower_ms = (canary_p95 - stable_p95) * 1000
        if ratio > policy.max_ttft_p95_ratio and slower_ms >= policy.min_ttft_p95_delta_ms:
            return (
                f"{what} p95 {canary_p95 * 1000:.1f}ms vs stable {stable_p95 * 1000:.1f}ms "
                f"(ratio {ratio:.2f} > {policy.max_ttft_p95_ratio})"
            )
    return None


class CanaryTracker:
    """Rolling windows for every (alias, version) that served traffic."""

    def __init__(self, policy: CanaryConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._windows: dict[tuple[str, str], VersionWindow] = {}

    def record(
        self, alias: str, version: str, *, ok: bool, ttft_s: float | None, stream: bool = True
    ) -> None:
        """One finished request: `ok` is False for upstream failures, ttft_s when a byte came
        (a whole answer's time when not `stream`)."""
        window = self._windows.get((alias, version))
        if window is None:
            window = self._windows[(alias, version)] = VersionWindow(self.policy.max_samples)
        window.add(self._clock(), ok, ttft_s, stream)

    def stats(self, alias: str, version: str) -> WindowStats:
        """The window's summary for one version (empty if it never served)."""
        window = self._windows.get((alias, version))
        if window is None:
            return WindowStats(samples=0, errors=0, ttft_samples=0, ttft_p95=None)
        return window.stats(self._clock(), self.policy.window_s)

    def forget(self, alias: str, version: str) -> None:
        """Drop a version's samples, so a rolled-back canary starts clean when it returns."""
        self._windows.pop((alias, version), None)

    def evaluate(self, table: RoutingTable) -> list[Verdict]:
        """Every canary with traffic that is worse than its alias's stable version."""
        verdicts: list[Verdict] = []
        for alias in table.aliases.values():
            weights = alias.weights()
            if weights.get(alias.stable, 0.0) <= 0:
                continue  # nothing to fall back to that is known good
            stable_stats = self.stats(alias.name, alias.stable)
            for version, weight in weights.items():
                if version == alias.stable or weight <= 0:
                    continue
                canary_stats = self.stats(alias.name, version)
                reason = judge(self.policy, stable_stats, canary_stats)
                if reason is not None:
                    verdicts.append(
                        Verdict(
                            alias.name, version, alias.stable, reason, canary_stats, stable_stats
                        )
                    )
        return verdicts


class CanaryMonitor:
    """Feeds outcomes to the tracker and, if the policy says so, rolls a worse canary back."""

    def __init__(
        self,
        rollout: Rollout,
        policy: CanaryConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rollout = rollout
        self.tracker = CanaryTracker(policy, clock)
        self._clock = clock
        self._next_check = clock() + policy.check_interval_s

    @property
    def policy(self) -> CanaryConfig:
        """The thresholds in force."""
        return self.tracker.policy

    def set_policy(self, policy: CanaryConfig) -> None:
        """New thresholds (a reload); windows restart since their bounds may have changed."""
        self.tracker = CanaryTracker(policy, self._clock)

    def record(
        self, alias: str, version: str, *, ok: bool, ttft_s: float | None, stream: bool = True
    ) -> list[Verdict]:
        """Record an outcome; at most once per check interval, judge and roll back."""
        self.tracker.record(alias, version, ok=ok, ttft_s=ttft_s, stream=stream)
        now = self._clock()
        if not self.policy.auto_rollback or now < self._next_check:
            return []
        self._next_check = now + self.policy.check_interval_s
        return self.check()

    def check(self) -> list[Verdict]:
        """Judge every canary now; roll back each worse one (to weight 0, stable keeps serving)."""
        verdicts = self.tracker.evaluate(self.rollout.table)
        for v in verdicts:
            self.rollout.set_weights(v.alias, {v.canary: 0.0})
            self.tracker.forget(v.alias, v.canary)
            log.warning(
                "canary rollback: model %s version %s set to weight 0, stable %s keeps serving: "
                "%s (canary n=%d, stable n=%d)",
                v.alias,
                v.canary,
                v.stable,
                v.reason,
                v.canary_stats.samples,
                v.stable_stats.samples,
            )
        return verdicts
