"""Pure region selection: an ordered list of fallbacks for one request, nearest healthy first."""

from __future__ import annotations

import random
from collections.abc import Sequence
from enum import Enum

import msgspec


class AdminState(Enum):
    """What an operator set on a region through the admin API."""

    ACTIVE = "active"
    # No new requests; requests already running there finish.
    DRAINED = "drained"
    # No new requests, not even when every other region is down.
    DISABLED = "disabled"


class Candidate(msgspec.Struct, frozen=True):
    """What selection needs to know about one region that serves the requested model."""

    name: str
    # Healthy by active probes and not ejected by passive outcomes.
    available: bool
    ewma_rtt_s: float | None
    ewma_ttft_s: float | None
    bias_s: float = 0.0
    in_flight: int = 0
    admin: AdminState = AdminState.ACTIVE
    # Unhealthy by probes (as opposed to only ejected): tried last in panic mode.
    healthy: bool = True


class Ranked(msgspec.Struct, frozen=True):
    """One region in the answer, with the score it was ranked by."""

    name: str
    score_s: float


class Selection(msgspec.Struct, frozen=True):
    """The regions to try, in order; `panic` when none was available and all were ranked anyway."""

    order: tuple[Ranked, ...]
    panic: bool = False

    @property
    def names(self) -> list[str]:
        """Region names in attempt order."""
        return [r.name for r in self.order]


def _filled(values: Sequence[float | None]) -> list[float]:
    """Unmeasured latencies take the best measured one: unknown is neither a bonus nor a penalty."""
    known = [v for v in values if v is not None]
    fill = min(known) if known else 0.0
    return [fill if v is None else v for v in values]


def scores(candidates: Sequence[Candidate]) -> list[float]:
    """Score per candidate: EWMA probe RTT + EWMA TTFT + static bias (lower is nearer)."""
    rtts = _filled([c.ewma_rtt_s for c in candidates])
    ttfts = _filled([c.ewma_ttft_s for c in candidates])
    return [r + t + c.bias_s for r, t, c in zip(rtts, ttfts, candidates, strict=True)]


def select(
    candidates: Sequence[Candidate],
    *,
    tolerance_s: float,
    rng: random.Random,
    panic: bool = True,
) -> Selection:
    """Order `candidates`: power-of-two-choices in the tolerance band of the best, then by score.

    Drained and disabled regions never appear. Unavailable (unhealthy or ejected) ones appear only
    in panic mode, when no region is available, so a total outage still gets a try (bounded by the
    caller's attempt limit and retry budget) instead of an instant 503.
    """
    score = scores(candidates)
    active = [
        (s, c) for s, c in zip(score, candidates, strict=True) if c.admin is AdminState.ACTIVE
    ]
    usable = [(s, c) for s, c in active if c.available]
    in_panic = False
    if not usable:
        if not panic or not active:
            return Selection(())
        in_panic = True
        # Ejected-but-probing-fine regions before probe-unhealthy ones, then by score.
        usable = sorted(active, key=lambda sc: (not sc[1].healthy, sc[0], sc[1].name))
    else:
        usable.sort(key=lambda sc: (sc[0], sc[1].name))
    best = usable[0][0]
    # In panic mode the order is a last resort, not load to spread.
    band = [] if in_panic else [sc for sc in usable if sc[0] <= best + tolerance_s]
    first = usable[0]
    if len(band) >= 2:
        a, b = rng.sample(band, 2)
        # Fewer in-flight wins; a tie goes to the nearer one.
        first = min(a, b, key=lambda sc: (sc[1].in_flight, sc[0], sc[1].name))
    rest = [sc for sc in usable if sc is not first]
    order = tuple(Ranked(c.name, s) for s, c in [first, *rest])
    return Selection(order, panic=in_panic)
