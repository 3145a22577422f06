"""Routing policy per request: nearest-healthy selection, retry state, passive health, headers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence

from router.config import Config, RoutingConfig
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind, health_outcome
from router.core.stages import Selector
from router.core.upstream import Upstream, Upstreams
from router.routing import circuit
from router.routing.budget import RetryBudget
from router.routing.circuit import Circuits
from router.routing.health import Health

log = logging.getLogger("router")

# Failures that come with an answer from the region: it is up, the model there is failing.
_ANSWERED = frozenset({FailureKind.STATUS, FailureKind.INVALID, FailureKind.TOO_LARGE})
# A client's deadline: the OpenAI SDKs send their timeout as x-stainless-timeout (s), the Python
# SDK its read timeout as x-stainless-read-timeout (the router sends nothing while it waits, so
# the client gives up at that point too).
_DEADLINE_HEADERS = (
    ("x-router-timeout-ms", 0.001),
    ("x-stainless-timeout", 1.0),
    ("x-stainless-read-timeout", 1.0),
)


def client_deadline(headers: Mapping[str, str], now: float) -> float | None:
    """The monotonic time the client stops waiting, from its timeout header; None if unsaid."""
    for name, scale in _DEADLINE_HEADERS:
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw) * scale
        except ValueError:
            continue
        if seconds > 0 and seconds == seconds and seconds != float("inf"):
            return now + seconds
    return None


class LiveRouting:
    """The [routing] section in force, its retry budget and its circuits; a config reload swaps
    the first two and retunes the circuits (their state kept)."""

    __slots__ = ("budget", "circuits", "config", "on_change")

    def __init__(self, config: RoutingConfig) -> None:
        self.config = config
        self.budget = _budget(config)
        self.circuits = Circuits(config.circuit_after, config.circuit_base_s, config.circuit_max_s)
        # Called with the new section on every applied change (the mid-stream policy).
        self.on_change: list[Callable[[RoutingConfig], None]] = []

    def prepare(self, old: Config, new: Config) -> Callable[[], None]:
        """Reload preparer: the new section, a fresh budget only if its parameters changed."""
        routing = new.routing
        if routing == self.config:
            return lambda: None
        same = all(
            getattr(routing, f) == getattr(self.config, f)
            for f in ("retry_budget_ratio", "retry_budget_min", "retry_budget_window_s")
        )
        budget = self.budget if same else _budget(routing)
        circuit.check(routing.circuit_after, routing.circuit_base_s, routing.circuit_max_s)

        def commit() -> None:
            self.config = routing
            self.budget = budget
            self.circuits.retune(
                routing.circuit_after, routing.circuit_base_s, routing.circuit_max_s
            )
            for hook in self.on_change:
                hook(routing)

        return commit


def _budget(config: RoutingConfig) -> RetryBudget:
    return RetryBudget(
        ratio=config.retry_budget_ratio,
        min_retries=config.retry_budget_min,
        window_s=config.retry_budget_window_s,
    )


def selector(health: Health, live: LiveRouting, circuits: Circuits | None = None) -> Selector:
    """Regions serving the model, nearest healthy first (see selection.select); a region whose
    circuit for this model is open goes last."""

    panicking = False

    def select(ctx: RequestContext, upstreams: Upstreams) -> Sequence[Upstream]:
        nonlocal panicking
        model = ctx.request.upstream_model
        serving = upstreams.serving(model)
        by_name: dict[str, Upstream] = {}
        for u in serving:
            by_name[u.name] = u
        chosen = health.select(by_name, live.config)
        if chosen.panic != panicking:
            # Once per change, not per request: an outage must not flood the log.
            panicking = chosen.panic
            if panicking:
                log.warning("no region available: trying unavailable ones anyway (panic mode)")
            else:
                log.warning("a region is available again: panic mode over")
        ordered: list[Upstream] = []
        tripped: list[Upstream] = []
        now = time.monotonic()
        for ranked in chosen.order:
            upstream = by_name[ranked.name]
            # A pair due for its trial is the request's to try (PassiveHealth settles it).
            if circuits is None or circuits.closed(upstream.name, model, now, ctx):
                ordered.append(upstream)
            else:
                tripped.append(upstream)
        return ordered + tripped if tripped else ordered

    return select


def hedge_delay(health: Health, live: LiveRouting) -> Callable[[str], float | None]:
    """[routing] hedge_delay_ms, or else the region's measured p95 TTFT (None: no data yet)."""

    def delay_of(region: str) -> float | None:
        fixed = live.config.hedge_delay_ms
        if fixed is not None:
            return fixed / 1000
        h = health.snapshot().get(region)
        return None if h is None else h.ttft_p95_s

    return delay_of


class PassiveHealth:
    """Every attempt's outcome and latency into the health table and the (region, model)
    circuits (an AttemptObserver), and how each stream ended (a StreamObserver).

    A region that answered with an error is alive: that counts against the model there (its
    circuit), not against the region and its other models. A stream's first byte is not yet
    its success: it is reported when the stream ends, a success (with its TTFT) if it went
    through, else a failure of the region and of the model there, so that a region cutting
    every stream after its first token builds up consecutive failures and is ejected (and its
    circuit opens) like one that fails before it."""

    __slots__ = ("circuits", "health")

    def __init__(self, health: Health, circuits: Circuits | None = None) -> None:
        self.health = health
        self.circuits = circuits

    def __call__(
        self, ctx: RequestContext, upstream: Upstream, error: AttemptError | None, s: float
    ) -> None:
        name = upstream.name
        model = ctx.request.upstream_model
        circuits = self.circuits
        if error is None:
            if not ctx.request.stream:  # a stream is known once it ends: `broke`, `went_through`
                self._went_through(name, model, total_s=s)
            return
        retry_after = error.retry_after_s
        if circuits is not None and retry_after is not None:
            # A region shedding load said for how long: others first until then (no failure).
            circuits.hold(name, model, retry_after, time.monotonic())
        outcome = health_outcome(error.kind, error.status)
        if outcome is None:  # admission's "full here", the request's own fault: nothing
            if circuits is not None:
                circuits.release(ctx, name, model)  # nor against a trial there
            return
        unserved = error.kind == FailureKind.UNSERVED
        if circuits is not None and (
            unserved or (outcome != "neutral" and error.kind in _ANSWERED)
        ):
            # The region is up and answered: the failure is this model's there (its circuit);
            # a region that cannot be reached at all is the prober's and ejection's business.
            if retry_after is None and circuits.record(name, model, False, time.monotonic()):
                why = "answering it has no such model" if unserved else outcome
                log.warning("region %s: circuit for model %s open after %s", name, model, why)
            outcome = "neutral"
        elif circuits is not None:
            if outcome == "neutral":  # busy (a 429), not failing: a trial there is given back
                circuits.release(ctx, name, model)
            elif circuits.unreached(name, model, time.monotonic()):
                log.warning("region %s: circuit for model %s open after %s", name, model, outcome)
        self.health.report(name, outcome)

    def broke(self, ctx: RequestContext, region: str, model: str) -> None:
        """The stream from `region` broke after its first byte: a failure of the region (it
        may be gone) and of the model there (it may be failing)."""
        self.health.report(region, "server_error")
        circuits = self.circuits
        if circuits is not None and circuits.record(region, model, False, time.monotonic()):
            log.warning("region %s: circuit for model %s open after broken streams", region, model)

    def went_through(self, ctx: RequestContext, region: str, model: str, ttft_s: float) -> None:
        """The stream from `region` did not break (or its client left, which says nothing
        against the region)."""
        self._went_through(region, model, ttft_s=ttft_s)

    def ended(self, ctx: RequestContext) -> None:
        """The request's attempts are over: a trial it still holds is given back."""
        if self.circuits is not None:
            # Trials it was given and never settled (never sent, the client left): the next
            # request's to try.
            self.circuits.release(ctx)

    def _went_through(
        self, name: str, model: str, *, ttft_s: float | None = None, total_s: float | None = None
    ) -> None:
        self.health.report(name, "ok", ttft_s=ttft_s, total_s=total_s)
        if self.circuits is not None:
            self.circuits.record(name, model, True, time.monotonic())


def routing_headers(ctx: RequestContext, headers: MutableMapping[str, str]) -> None:
    """A response decorator: which region served the request, after how many attempts."""
    if ctx.region is None or ctx.attempts == 0:
        return
    hedged = ctx.hedged
    headers["x-router-region"] = ctx.region
    headers["x-router-attempts"] = str(ctx.attempts)
    # A hedge is a second attempt alongside the first, not a failover after it failed.
    hedges = 1 if hedged is not None else 0
    headers["x-router-failovers"] = str(max(0, ctx.attempts - 1 - hedges))
    if hedged is not None:
        headers["x-router-hedged"] = hedged
    if ctx.fallback is not None:
        headers["x-router-fallback-model"] = ctx.fallback


class RetryState:
    """The retry policy the driver asks per request: deadline, attempt gate, first-byte timeout."""

    __slots__ = ("live",)

    def __init__(self, live: LiveRouting) -> None:
        self.live = live

    def begin(self, ctx: RequestContext, headers: Mapping[str, str]) -> None:
        """Remember the client's deadline so no attempt starts after it."""
        ctx.deadline = client_deadline(headers, time.monotonic())

    def allow(self, ctx: RequestContext) -> bool:
        """Whether another attempt may start: client deadline, attempt cap (per model), retry
        budget. The first attempt is always allowed, and counts the request for the budget; a
        fallback model's first is not a retry."""
        now = time.monotonic()
        live = self.live
        budget = live.budget
        if ctx.attempts == 0:
            budget.record_request(now)
            return True
        deadline = ctx.deadline
        if deadline is not None and now >= deadline:
            return False
        tried = ctx.attempts - ctx.spills - ctx.model_base
        if tried == 0:
            return True  # a fallback model's first attempt, at its own regions
        if tried >= live.config.max_attempts:
            return False
        if ctx.free_retry:
            # The failed attempt never reached its region, or its connection broke and this one
            # goes elsewhere: no region gets a request twice, so no budget is spent.
            return True
        if not budget.try_retry(now):
            log.warning("request %s: retry budget exhausted, not retrying", ctx.request_id)
            return False
        return True

    def first_byte(self, ctx: RequestContext, configured: float) -> float:
        """An attempt's first-byte timeout: [routing] ttft_timeout_s (else `configured`), cut
        to the client's deadline."""
        config = self.live.config
        timeout = config.ttft_timeout_s or configured
        stream_ttft = config.stream_ttft_timeout_s
        others = len(ctx.candidates) > 1 or ctx.more_models
        if stream_ttft is not None and others and ctx.request.stream:
            timeout = min(timeout, stream_ttft)
        deadline = ctx.deadline
        if deadline is not None:
            timeout = min(timeout, max(0.001, deadline - time.monotonic()))
        return timeout
