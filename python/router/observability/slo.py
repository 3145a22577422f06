"""Pure SLO bookkeeping: rolling TTFT quantiles and error rate per region against targets."""

from __future__ import annotations

from dataclasses import dataclass

from router.observability.quantiles import OVERALL, QuantileBoard

QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class SloTargets:
    """Objectives: TTFT p95 under `ttft_p95_s` and error rate under `error_rate`."""

    ttft_p95_s: float = 0.200
    error_rate: float = 0.001
    window_s: float = 300.0


class RollingCounts:
    """Requests and errors over the last `window_s` seconds, in a ring of sub-window slots."""

    __slots__ = ("_epochs", "_errors", "_totals", "_width")

    def __init__(self, window_s: float, slots: int = 10) -> None:
        self._width = window_s / slots
        self._epochs = [-1] * slots
        self._totals = [0] * slots
        self._errors = [0] * slots

    def add(self, error: bool, now: float) -> None:
        """Count one request (and one error if `error`) at time `now`."""
        epoch = int(now // self._width)
        i = epoch % len(self._epochs)
        if self._epochs[i] != epoch:
            self._epochs[i] = epoch
            self._totals[i] = 0
            self._errors[i] = 0
        self._totals[i] += 1
        self._errors[i] += error

    def totals(self, now: float) -> tuple[int, int]:
        """(requests, errors) within the window ending at `now`."""
        epoch = int(now // self._width)
        oldest = epoch - len(self._epochs) + 1
        total = errors = 0
        for e, t, x in zip(self._epochs, self._totals, self._errors, strict=True):
            if oldest <= e <= epoch:
                total += t
                errors += x
        return total, errors


@dataclass(frozen=True, slots=True)
class SloStatus:
    """Rolling figures of one region (or OVERALL) and whether they meet the targets."""

    key: str
    requests: int
    errors: int
    error_rate: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    ttft_ok: bool
    errors_ok: bool

    @property
    def ok(self) -> bool:
        """Both objectives met; with no traffic there is nothing to violate."""
        return self.ttft_ok and self.errors_ok


def is_error(status: int) -> bool:
    """An answer's status that fails the service (5xx); a client's 4xx is its own (see
    SloTracker.observe for what else counts)."""
    return status >= 500


class SloTracker:
    """Feeds rolling TTFT sketches and error counts; reports compliance per region and overall."""

    __slots__ = ("_counts", "targets", "ttft")

    def __init__(self, targets: SloTargets | None = None, alpha: float = 0.01) -> None:
        self.targets = targets or SloTargets()
        self.ttft = QuantileBoard(window_s=self.targets.window_s, slots=10, alpha=alpha)
        self._counts: dict[str, RollingCounts] = {OVERALL: RollingCounts(self.targets.window_s)}

    def observe(
        self,
        region: str | None,
        status: int,
        ttft_s: float | None,
        now: float,
        *,
        broken: bool = False,
    ) -> None:
        """Record one finished request; `region` None (a cache hit) counts only overall. A
        client's own error (4xx: a bad key, a bad body, over its limit, gone) is no measure of
        the service and is not counted at all, so a flood of them cannot make either objective
        look met; a region's 429 passed on (every region full) and a stream ended by a failure
        event (`broken`) are errors despite their status."""
        if 400 <= status < 500:
            if status != 429 or region is None:
                return
            # A region's 429 passed on: every region was full, a failure of the service.
            error = True
        else:
            error = broken or is_error(status)
        self._counts[OVERALL].add(error, now)
        if region is not None:
            counts = self._counts.get(region)
            if counts is None:
                counts = self._counts[region] = RollingCounts(self.targets.window_s)
            counts.add(error, now)
        if ttft_s is not None and not error:
            self.ttft.add(region if region is not None else OVERALL, ttft_s, now)

    def names(self) -> list[str]:
        """OVERALL first, then every region seen."""
        seen = dict.fromkeys([*self._counts, *self.ttft.keys()])
        return list(seen)

    def status(self, key: str, now: float) -> SloStatus:
        """Rolling figures for `key` at `now`."""
        counts = self._counts.get(key)
        requests, errors = counts.totals(now) if counts is not None else (0, 0)
        p50, p95, p99 = self.ttft.quantiles(key, QUANTILES, now)
        rate = errors / requests if requests else None
        return SloStatus(
            key=key,
            requests=requests,
            errors=errors,
            error_rate=rate,
            ttft_p50_s=p50,
            ttft_p95_s=p95,
            ttft_p99_s=p99,
            ttft_ok=p95 is None or p95 <= self.targets.ttft_p95_s,
            errors_ok=rate is None or rate <= self.targets.error_rate,
        )

    def report(self, now: float) -> list[SloStatus]:
        """Status of every key, OVERALL first."""
        return [self.status(k, now) for k in self.names()]
