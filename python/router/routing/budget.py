"""Pure retry budget (Finagle/Envoy style): retries stay under a share of recent requests."""

from __future__ import annotations

import math


class RetryBudget:
    """Allows a retry while retries over the sliding window < min_retries + ratio * requests.

    The window is split into buckets so old traffic ages out smoothly; time is passed in, so
    the budget is unit-tested without a clock.
    """

    __slots__ = ("_buckets", "_requests", "_retries", "_start", "min_retries", "ratio", "width")

    def __init__(
        self, ratio: float = 0.2, min_retries: int = 10, window_s: float = 10.0, buckets: int = 10
    ) -> None:
        if not 0.0 <= ratio <= 10.0 or min_retries < 0 or window_s <= 0 or buckets < 1:
            raise ValueError("ratio in [0, 10], min_retries >= 0, window_s > 0, buckets >= 1")
        self.ratio = ratio
        self.min_retries = min_retries
        self.width = window_s / buckets
        self._buckets = buckets
        # Ring of per-bucket counts; _start is the absolute index of the oldest bucket.
        self._requests = [0] * buckets
        self._retries = [0] * buckets
        self._start = 0

    def _slot(self, now: float) -> int:
        index = math.floor(now / self.width)
        if index >= self._start + self._buckets:
            # Clear the buckets that fell out of the window (all of them after a long gap).
            expired = min(index - (self._start + self._buckets) + 1, self._buckets)
            for i in range(expired):
                slot = (self._start + i) % self._buckets
                self._requests[slot] = 0
                self._retries[slot] = 0
            self._start = index - self._buckets + 1
        # A timestamp older than the window (clock skew between callers) lands in the oldest.
        return max(index, self._start) % self._buckets

    def record_request(self, now: float) -> None:
        """Count one client request (the first attempt, not retries)."""
        self._requests[self._slot(now)] += 1

    def allowance(self, now: float) -> float:
        """Retries still allowed right now."""
        self._slot(now)
        return self.min_retries + self.ratio * sum(self._requests) - sum(self._retries)

    def try_retry(self, now: float) -> bool:
        """Spend one retry if the budget allows it."""
        slot = self._slot(now)
        if self.min_retries + self.ratio * sum(self._requests) - sum(self._retries) < 1:
            return False
        self._retries[slot] += 1
        return True

    def counts(self, now: float) -> tuple[int, int]:
        """(requests, retries) in the current window."""
        self._slot(now)
        return sum(self._requests), sum(self._retries)
