"""Pure streaming quantiles: a DDSketch-style log-bucket sketch and rolling windows of them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# Below this a value counts as zero: log() of it would be meaningless for latencies.
MIN_INDEXABLE = 1e-9


class Sketch:
    """Log-bucket quantile sketch: every quantile is within `alpha` relative error (DDSketch)."""

    __slots__ = ("_bins", "_gamma", "_inv_log_gamma", "_max_bins", "alpha", "count", "zeros")

    def __init__(self, alpha: float = 0.01, max_bins: int = 2048) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if max_bins < 1:
            raise ValueError(f"max_bins must be positive, got {max_bins}")
        self.alpha = alpha
        self._gamma = (1.0 + alpha) / (1.0 - alpha)
        self._inv_log_gamma = 1.0 / math.log(self._gamma)
        self._max_bins = max_bins
        self._bins: dict[int, int] = {}
        self.count = 0
        self.zeros = 0

    def add(self, value: float, weight: int = 1) -> None:
        """Record `value` (`weight` times); values at or below zero land in the zero bucket."""
        self.count += weight
        if value <= MIN_INDEXABLE:
            self.zeros += weight
            return
        key = math.ceil(math.log(value) * self._inv_log_gamma)
        bins = self._bins
        bins[key] = bins.get(key, 0) + weight
        if len(bins) > self._max_bins:
            self._collapse()

    def _collapse(self) -> None:
        # Folding the lowest buckets together keeps memory bounded and the high quantiles
        # (the ones an SLO cares about) exact to alpha.
        keys = sorted(self._bins)
        excess = len(keys) - self._max_bins
        folded = sum(self._bins.pop(k) for k in keys[: excess + 1])
        self._bins[keys[excess]] = self._bins.get(keys[excess], 0) + folded

    def merge(self, other: Sketch) -> None:
        """Add every value of `other` (same alpha) into this sketch."""
        if other.alpha != self.alpha:
            raise ValueError("cannot merge sketches with different alpha")
        self.count += other.count
        self.zeros += other.zeros
        bins = self._bins
        for key, n in other._bins.items():
            bins[key] = bins.get(key, 0) + n
        while len(bins) > self._max_bins:
            self._collapse()

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1) of the recorded values, or None when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        if self.count == 0:
            return None
        rank = q * (self.count - 1)
        seen = self.zeros
        if seen > rank:
            return 0.0
        for key in sorted(self._bins):
            seen += self._bins[key]
            if seen > rank:
                return 2.0 * self._gamma**key / (self._gamma + 1.0)
        raise AssertionError("unreachable: bins sum to count")  # pragma: no cover

    def quantiles(self, qs: Sequence[float]) -> list[float | None]:
        """Several quantiles, sorting the buckets once."""
        if self.count == 0:
            return [None] * len(qs)
        keys = sorted(self._bins)
        out: list[float | None] = []
        for q in qs:
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantile must be in [0, 1], got {q}")
            rank = q * (self.count - 1)
            seen = self.zeros
            value = 0.0
            if seen <= rank:
                for key in keys:
                    seen += self._bins[key]
                    if seen > rank:
                        value = 2.0 * self._gamma**key / (self._gamma + 1.0)
                        break
            out.append(value)
        return out

    @property
    def bins(self) -> int:
        """How many buckets are in use (the memory the sketch holds)."""
        return len(self._bins)

    def clear(self) -> None:
        """Forget every value."""
        self._bins.clear()
        self.count = 0
        self.zeros = 0


class RollingSketch:
    """Quantiles over the last `window_s` seconds: a ring of `slots` sketches, one per slot."""

    __slots__ = ("_alpha", "_epochs", "_max_bins", "_ring", "_width", "window_s")

    def __init__(
        self, window_s: float = 60.0, slots: int = 6, alpha: float = 0.01, max_bins: int = 2048
    ) -> None:
        if window_s <= 0 or slots < 1:
            raise ValueError("window_s must be positive and slots at least 1")
        self.window_s = window_s
        self._width = window_s / slots
        self._alpha = alpha
        self._max_bins = max_bins
        self._ring = [Sketch(alpha, max_bins) for _ in range(slots)]
        self._epochs = [-1] * slots

    def add(self, value: float, now: float) -> None:
        """Record `value` observed at time `now` (seconds on any monotonic clock)."""
        epoch = int(now // self._width)
        i = epoch % len(self._ring)
        if self._epochs[i] != epoch:
            self._ring[i].clear()
            self._epochs[i] = epoch
        self._ring[i].add(value)

    def window(self, now: float) -> Sketch:
        """A sketch of every value recorded in the window ending at `now`."""
        epoch = int(now // self._width)
        oldest = epoch - len(self._ring) + 1
        merged = Sketch(self._alpha, self._max_bins)
        for e, sketch in zip(self._epochs, self._ring, strict=True):
            if oldest <= e <= epoch:
                merged.merge(sketch)
        return merged

    def quantiles(self, qs: Sequence[float], now: float) -> list[float | None]:
        """Rolling quantiles at time `now`."""
        return self.window(now).quantiles(qs)


OVERALL = "*"


class QuantileBoard:
    """Rolling sketches per key (a region) plus one over all keys, created on first use."""

    __slots__ = ("_alpha", "_by_key", "_slots", "_window_s")

    def __init__(self, window_s: float = 60.0, slots: int = 6, alpha: float = 0.01) -> None:
        self._window_s = window_s
        self._slots = slots
        self._alpha = alpha
        self._by_key: dict[str, RollingSketch] = {OVERALL: self._new()}

    def _new(self) -> RollingSketch:
        return RollingSketch(self._window_s, self._slots, self._alpha)

    def add(self, key: str, value: float, now: float) -> None:
        """Record `value` for `key` and for the overall sketch."""
        sketch = self._by_key.get(key)
        if sketch is None:
            sketch = self._by_key[key] = self._new()
        sketch.add(value, now)
        if key != OVERALL:
            self._by_key[OVERALL].add(value, now)

    def keys(self) -> Iterable[str]:
        """Every key seen so far, the overall one first."""
        return list(self._by_key)

    def quantiles(self, key: str, qs: Sequence[float], now: float) -> list[float | None]:
        """Rolling quantiles for `key` (OVERALL for all); None entries when nothing was seen."""
        sketch = self._by_key.get(key)
        if sketch is None:
            return [None] * len(qs)
        return sketch.quantiles(qs, now)
