"""Circuit breakers per (region, model): a model that keeps failing in a region stops getting
traffic there, without ejecting the region's other models. Pure: time is passed in.

Closed: requests go as usual. After `failures_to_open` consecutive failures the circuit opens
for base_s * 2^(k-1) seconds (k: times opened in a row, capped at max_s): the pair is tried
last, after every other candidate. When that time is up, one request tries it first
(half-open): it holds the trial on a lease. Its success closes the circuit; a failure of the
region there (an error answer, no answer, a broken stream) opens it again for longer; an ending
that says nothing of the region (the client left, the request's own fault, a full admission
queue, the request served elsewhere first) gives the trial back for the next request. A lease
never given back lapses after max_s, so a lost trial cannot keep the pair out for good.
"""

from __future__ import annotations

from dataclasses import dataclass

Key = tuple[str, str]


@dataclass(slots=True)
class _Circuit:
    failures: int = 0
    opened: int = 0  # times opened in a row
    until: float = 0.0  # open until (monotonic); 0 when closed
    trial_until: float = 0.0  # the half-open trial's lease runs out then; 0: no trial
    holder: object = None  # who holds the trial (a request)


def check(failures_to_open: int, base_s: float, max_s: float) -> None:
    """ValueError unless the thresholds make sense."""
    if failures_to_open < 1 or base_s <= 0 or max_s < base_s:
        raise ValueError("failures_to_open >= 1 and 0 < base_s <= max_s")


class Circuits:
    """Every (region, model) pair's breaker; pairs never seen are closed."""

    __slots__ = ("_circuits", "base_s", "failures_to_open", "max_s")

    def __init__(self, failures_to_open: int = 3, base_s: float = 5.0, max_s: float = 30.0) -> None:
        self.retune(failures_to_open, base_s, max_s)
        self._circuits: dict[Key, _Circuit] = {}

    def retune(self, failures_to_open: int, base_s: float, max_s: float) -> None:
        """New thresholds (a reloaded [routing]); circuits keep their state, an open one its
        current deadline."""
        check(failures_to_open, base_s, max_s)
        self.failures_to_open = failures_to_open
        self.base_s = base_s
        self.max_s = max_s

    def closed(self, region: str, model: str, now: float, holder: object = None) -> bool:
        """Whether the pair takes traffic in its usual place (closed, or due for its trial,
        which this call then gives `holder` for at most max_s)."""
        circuit = self._circuits.get((region, model))
        if circuit is None or circuit.until == 0.0:
            return True
        if now < circuit.until or now < circuit.trial_until:
            return False  # open, or another request's trial is under way
        if circuit.opened == 0:
            circuit.until = 0.0  # a hold (Retry-After) ran out: as it was before
            return True
        circuit.trial_until = now + self.max_s
        circuit.holder = holder
        return True

    def record(self, region: str, model: str, ok: bool, now: float) -> bool:
        """One attempt's outcome; True when it opened the circuit."""
        key = (region, model)
        circuit = self._circuits.get(key)
        if ok:
            if circuit is not None:
                del self._circuits[key]
            return False
        if circuit is None:
            circuit = self._circuits[key] = _Circuit()
        circuit.failures += 1
        if self._half_open(circuit, now) or (
            circuit.until == 0.0 and circuit.failures >= self.failures_to_open
        ):
            self._open(circuit, now)
            return True
        return False

    def unreached(self, region: str, model: str, now: float) -> bool:
        """The region could not be reached or stayed silent (connect failure, no first byte, a
        connection broken before the answer): a half-open circuit opens again, for longer (its
        trial failed); a closed one counts nothing, the region's health (ejection) being the
        judge of that. True when it opened the circuit."""
        circuit = self._circuits.get((region, model))
        if circuit is None or not self._half_open(circuit, now):
            return False
        circuit.failures += 1
        self._open(circuit, now)
        return True

    def release(self, holder: object, region: str | None = None, model: str | None = None) -> None:
        """`holder`'s trial of the pair (of every pair when none is named) ended saying nothing
        of the region: the next request may try it."""
        for key, circuit in self._circuits.items():
            if circuit.holder is holder and (region is None or key == (region, model)):
                circuit.trial_until = 0.0
                circuit.holder = None

    def hold(self, region: str, model: str, seconds: float, now: float) -> None:
        """The region asked to be left alone for `seconds` (Retry-After on a 429 or 5xx): the
        pair goes last until then (at most max_s), then takes requests as before (a trial, if
        it was open); no failure is counted, since shedding load is not failing."""
        circuit = self._circuits.get((region, model))
        if circuit is None:
            circuit = self._circuits[(region, model)] = _Circuit()
        circuit.until = max(circuit.until, now + min(seconds, self.max_s))
        circuit.trial_until = 0.0
        circuit.holder = None

    def open_pairs(self, now: float) -> list[tuple[str, str, float]]:
        """(region, model, seconds until its trial) of every open circuit."""
        return [
            (region, model, max(0.0, c.until - now))
            for (region, model), c in self._circuits.items()
            if c.until
        ]

    @staticmethod
    def _half_open(circuit: _Circuit, now: float) -> bool:
        """Whether the open time of a circuit that opened ran out: its trial is due or under
        way, and a failure there is the trial's."""
        return circuit.opened > 0 and circuit.until != 0.0 and now >= circuit.until

    def _open(self, circuit: _Circuit, now: float) -> None:
        circuit.opened += 1
        circuit.until = now + min(self.max_s, self.base_s * 2 ** (circuit.opened - 1))
        circuit.trial_until = 0.0
        circuit.holder = None
