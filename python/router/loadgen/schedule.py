"""Pure: open-loop arrival schedules, bounded by both duration and count."""

from __future__ import annotations

import random


def poisson_schedule(
    rate: float, duration_s: float, max_count: int, rng: random.Random
) -> list[float]:
    """Send offsets (seconds from start) of a Poisson process at `rate`/s, all < duration_s."""
    if rate <= 0 or not rate < float("inf"):
        raise ValueError(f"rate must be a positive finite number, got {rate}")
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    if max_count < 0:
        raise ValueError(f"max_count must be >= 0, got {max_count}")
    offsets: list[float] = []
    t = 0.0
    while len(offsets) < max_count:
        # Exponential gaps between arrivals are what makes the process Poisson.
        t += rng.expovariate(rate)
        if t >= duration_s:
            break
        offsets.append(t)
    return offsets
