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


def _fill(values: list[float | None]) -> list[float]:
    """Unmeasured latencies take the best measured one: unknown is neither a bonus nor a penalty."""
    fill: float | None = None
    for v in values:
        if v is not None and (fill is None or v < fill):
            fill = v
    if fill is None:
        fill = 0.0
    out: list[float] = []
    for v in values:
        out.append(fill if v is None else v)
    return out


def scores(candidates: Sequence[Candidate]) -> list[float]:
    """Score per candidate: EWMA probe RTT + EWMA TTFT + static bias (lower is nearer)."""
    # Loops rather than comprehensions: this runs on every request, and each comprehension is a
    # function call of its own on CPython 3.11.
    rtts: list[float | None] = []
    ttfts: list[float | None] = []
    for c in candidates:
        rtts.append(c.ewma_rtt_s)
        ttfts.append(c.ewma_ttft_s)
    rtt = _fill(rtts)
    ttft = _fill(ttfts)
    out: list[float] = []
    for i, c in enumerate(candidates):
        out.append(rtt[i] + ttft[i] + c.bias_s)
    return out


def _rank_key(sc: tuple[float, Candidate]) -> tuple[float, str]:
    return sc[0], sc[1].name


def _panic_key(sc: tuple[float, Candidate]) -> tuple[bool, float, str]:
    # Ejected-but-probing-fine regions before probe-unhealthy ones, then by score.
    return not sc[1].healthy, sc[0], sc[1].name


def _load_key(sc: tuple[float, Candidate]) -> tuple[int, float, str]:
    # Fewer in-flight wins; a tie goes to the nearer one.
    return sc[1].in_flight, sc[0], sc[1].name


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
    if len(candidates) == 1:
        # One region serves the model (the usual case): nothing to rank or spread.
        c = candidates[0]
        if c.admin is not AdminState.ACTIVE or not (c.available or panic):
            return Selection(())
        rtt, ttft = c.ewma_rtt_s, c.ewma_ttft_s
        alone = (0.0 if rtt is None else rtt) + (0.0 if ttft is None else ttft) + c.bias_s
        return Selection((Ranked(c.name, alone),), panic=not c.available)
    score = scores(candidates)
    active: list[tuple[float, Candidate]] = []
    usable: list[tuple[float, Candidate]] = []
    for i, c in enumerate(candidates):
        if c.admin is AdminState.ACTIVE:
            active.append((score[i], c))
            if c.available:
                usable.append((score[i], c))
    in_panic = False
    if not usable:
        if not panic or not active:
            return Selection(())
        in_panic = True
        usable = sorted(active, key=_panic_key)
    elif len(usable) > 1:
        usable.sort(key=_rank_key)
    first = usable[0]
    if not in_panic and len(usable) > 1:
        # In panic mode the order is a last resort, not load to spread.
        limit = first[0] + tolerance_s
        band = [sc for sc in usable if sc[0] <= limit]
        if len(band) >= 2:
            a, b = rng.sample(band, 2)
            first = min(a, b, key=_load_key)
    order = [Ranked(first[1].name, first[0])]
    for sc in usable:
        if sc is not first:
            order.append(Ranked(sc[1].name, sc[0]))
    return Selection(tuple(order), panic=in_panic)
