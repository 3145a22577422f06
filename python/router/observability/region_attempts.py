"""Per-region attempt outcomes: what each attempt the router made at a region came to.

A request is one answer but may be several attempts (a failover, a retry, a hedge, a mid-stream
continuation), each at its own region; the request's metrics name only the region that
answered in the end. These counts name every region that was tried, so a region that failed
attempts others then served shows its failures, and an attempt the router's own admission
refused (the region never saw it) is told apart from one the region failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.core.failure import AttemptError, FailureKind
from router.observability.slo import RollingCounts

OK = "ok"
# The stream's first byte came, then it broke (the mid-stream policy says), whether or not
# another region continued it.
BROKEN = "broken"
# A 5xx answer, or an error event before a stream's first token.
SERVER_ERROR = "server_error"
# The region answered 429: it is full.
RATE_LIMITED = "rate_limited"

# The region failed the attempt: counted in its errors.
FAILED = frozenset(
    {
        SERVER_ERROR,
        RATE_LIMITED,
        BROKEN,
        FailureKind.TIMEOUT.value,
        FailureKind.CONNECT.value,
        FailureKind.DISCONNECT.value,
        FailureKind.INVALID.value,
        FailureKind.TOO_LARGE.value,
        # It said it has no such model, though the config says it serves it: its config drifted.
        FailureKind.UNSERVED.value,
    }
)
# Admission here was full: the attempt was never sent, the region never saw it.
SHED = FailureKind.SPILL.value
# Every outcome (`request` and `unsupported`: the region answered that the request itself is at
# fault, or that it cannot serve this one; no failure of the region).
OUTCOMES = (
    OK,
    *sorted(FAILED),
    SHED,
    FailureKind.REQUEST.value,
    FailureKind.UNSUPPORTED.value,
)


def outcome_of(error: AttemptError | None) -> str:
    """One attempt's outcome label: `ok`, or why it failed."""
    if error is None:
        return OK
    if error.kind == FailureKind.STATUS:
        return RATE_LIMITED if error.status is not None and error.status < 500 else SERVER_ERROR
    return error.kind.value


@dataclass(frozen=True, slots=True)
class AttemptTotals:
    """One region's attempts within the window."""

    attempts: int  # sent to the region, whatever came of them
    errors: int  # of those, failed by the region (FAILED)
    shed: int  # refused by the router's own admission, never sent

    @property
    def error_rate(self) -> float | None:
        """Failed attempts over attempts sent; None when none was sent."""
        return self.errors / self.attempts if self.attempts else None


class RegionAttempts:
    """Attempts per (region, outcome) since start, and per region over a rolling window."""

    __slots__ = ("_sent", "_shed", "counts", "window_s")

    def __init__(self, window_s: float = 300.0) -> None:
        self.window_s = window_s
        self.counts: dict[tuple[str, str], int] = {}
        self._sent: dict[str, RollingCounts] = {}
        self._shed: dict[str, RollingCounts] = {}

    def add(self, region: str, outcome: str, now: float) -> None:
        """Count one attempt at `region` that came to `outcome` at time `now`."""
        key = (region, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        rolling = self._shed if outcome == SHED else self._sent
        counts = rolling.get(region)
        if counts is None:
            counts = rolling[region] = RollingCounts(self.window_s)
        counts.add(outcome in FAILED, now)

    def names(self) -> list[str]:
        """Every region an attempt went (or was shed) to, in the order first seen."""
        return list(dict.fromkeys([*self._sent, *self._shed]))

    def totals(self, region: str, now: float) -> AttemptTotals:
        """`region`'s attempts within the window ending at `now`."""
        sent = self._sent.get(region)
        attempts, errors = sent.totals(now) if sent is not None else (0, 0)
        shed = self._shed.get(region)
        return AttemptTotals(attempts, errors, shed.totals(now)[0] if shed is not None else 0)
