"""Wires health, selection, the retry budget and the routing headers into the app."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiohttp import web

from router.config import Config, RoutingConfig
from router.core.context import RequestContext
from router.core.proxy import (
    FIRST_BYTE,
    HEDGER,
    MIDSTREAM,
    RETRY_GATE,
    AttemptError,
    AttemptHook,
    FirstByte,
)
from router.core.upstream import Upstream, Upstreams
from router.routing.admission import ADMISSION
from router.routing.budget import RetryBudget
from router.routing.continuation import MidstreamPolicy
from router.routing.health import Health, lifetime, outcome_of
from router.routing.hedge import HEDGED, hedger
from router.server import admin
from router.server.reload import RELOADER

log = logging.getLogger("router")

ContextOf = Callable[[web.Request], RequestContext | None]
Selector = Callable[[RequestContext, Upstreams], Sequence[Upstream]]
Stage = Callable[[web.Request, RequestContext], Awaitable[web.StreamResponse | None]]
Signal = Callable[[web.Request, web.StreamResponse], Awaitable[None]]

# ctx.extra keys this feature owns.
DEADLINE = "routing.deadline"
SELECTION = "routing.selection"
# A client's overall deadline: the OpenAI SDKs send their timeout as x-stainless-timeout (s).
_DEADLINE_HEADERS = (("x-router-timeout-ms", 0.001), ("x-stainless-timeout", 1.0))


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
    """The [routing] section in force and its retry budget; a config reload swaps them."""

    __slots__ = ("budget", "config", "on_change")

    def __init__(self, config: RoutingConfig) -> None:
        self.config = config
        self.budget = _budget(config)
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

        def commit() -> None:
            self.config = routing
            self.budget = budget
            for hook in self.on_change:
                hook(routing)

        return commit


ROUTING: web.AppKey[LiveRouting] = web.AppKey("router.routing", LiveRouting)


def _budget(config: RoutingConfig) -> RetryBudget:
    return RetryBudget(
        ratio=config.retry_budget_ratio,
        min_retries=config.retry_budget_min,
        window_s=config.retry_budget_window_s,
    )


def selector(health: Health, live: LiveRouting) -> Selector:
    """Regions serving the model, nearest healthy first (see selection.select)."""

    panicking = False

    def select(ctx: RequestContext, upstreams: Upstreams) -> Sequence[Upstream]:
        nonlocal panicking
        serving = upstreams.serving(ctx.request.upstream_model)
        by_name: dict[str, Upstream] = {}
        for u in serving:
            by_name[u.name] = u
        chosen = health.select(by_name, live.config)
        ctx.extra[SELECTION] = chosen
        if chosen.panic != panicking:
            # Once per change, not per request: an outage must not flood the log.
            panicking = chosen.panic
            if panicking:
                log.warning("no region available: trying unavailable ones anyway (panic mode)")
            else:
                log.warning("a region is available again: panic mode over")
        ordered: list[Upstream] = []
        for ranked in chosen.order:
            ordered.append(by_name[ranked.name])
        return ordered

    return select


def retry_gate(live: LiveRouting) -> Callable[[RequestContext], bool]:
    """Whether another attempt may start: attempt cap, client deadline, retry budget."""

    def gate(ctx: RequestContext) -> bool:
        now = time.monotonic()
        budget = live.budget
        if ctx.attempts == 0:
            budget.record_request(now)
            return True
        if ctx.attempts >= live.config.max_attempts:
            return False
        deadline = ctx.extra.get(DEADLINE)
        if isinstance(deadline, float) and now >= deadline:
            return False
        if not budget.try_retry(now):
            log.warning("request %s: retry budget exhausted, not retrying", ctx.request_id)
            return False
        return True

    return gate


def first_byte(live: LiveRouting) -> FirstByte:
    """An attempt's first-byte timeout: [routing] ttft_timeout_s, cut to the client's deadline."""

    def of(ctx: RequestContext, configured: float) -> float:
        timeout = live.config.ttft_timeout_s or configured
        deadline = ctx.extra.get(DEADLINE)
        if isinstance(deadline, float):
            timeout = min(timeout, max(0.001, deadline - time.monotonic()))
        return timeout

    return of


def hedge_delay(health: Health, live: LiveRouting) -> Callable[[str], float | None]:
    """[routing] hedge_delay_ms, or else the region's measured p95 TTFT (None: no data yet)."""

    def delay_of(region: str) -> float | None:
        fixed = live.config.hedge_delay_ms
        if fixed is not None:
            return fixed / 1000
        h = health.snapshot().get(region)
        return None if h is None else h.ttft_p95_s

    return delay_of


def passive_hook(health: Health) -> AttemptHook:
    """Every attempt's outcome and latency into the health table."""

    def hook(ctx: RequestContext, upstream: Upstream, error: AttemptError | None, s: float) -> None:
        if error is None:
            # An attempt returns at the first byte of a stream, or with a whole body.
            if ctx.request.stream:
                health.report(upstream.name, "ok", ttft_s=s)
            else:
                health.report(upstream.name, "ok", total_s=s)
            return
        if error.kind == "spill":
            return  # admission said "full here": nothing about the region's health
        health.report(upstream.name, outcome_of(error.kind, error.status))

    return hook


def _headers_stamp(context_of: ContextOf) -> Signal:
    """Every proxied response says which region served it and after how many attempts."""

    async def stamp(request: web.Request, response: web.StreamResponse) -> None:
        ctx = context_of(request)
        if ctx is None or ctx.region is None or ctx.attempts == 0:
            return
        hedged = ctx.extra.get(HEDGED)
        response.headers["x-router-region"] = ctx.region
        response.headers["x-router-attempts"] = str(ctx.attempts)
        # A hedge is a second attempt alongside the first, not a failover after it failed.
        hedges = 1 if isinstance(hedged, str) else 0
        response.headers["x-router-failovers"] = str(max(0, ctx.attempts - 1 - hedges))
        if isinstance(hedged, str):
            response.headers["x-router-hedged"] = hedged

    return stamp


def _deadline_stage() -> Stage:
    """Remember the client's deadline so no attempt starts after it."""

    async def stage(request: web.Request, ctx: RequestContext) -> web.StreamResponse | None:
        deadline = client_deadline(request.headers, time.monotonic())
        if deadline is not None:
            ctx.extra[DEADLINE] = deadline
        return None

    return stage


def install(
    app: web.Application,
    config: Config,
    *,
    context_of: ContextOf,
    hooks: list[AttemptHook],
    stages: list[Stage],
    ready_checks: list[Callable[[], bool]],
    guard: admin.Guard,
) -> Selector:
    """Health for the app's lifetime, passive reports, budget, headers, admin; -> the selector."""
    routing = config.routing
    health = Health(config.health, config.regions)
    app[admin.HEALTH] = health
    app.cleanup_ctx.append(lifetime(health))
    live = LiveRouting(routing)
    app[ROUTING] = live
    app[RETRY_GATE] = retry_gate(live)
    app[FIRST_BYTE] = first_byte(live)
    app[HEDGER] = hedger(lambda: live.config.hedge_endpoints, hedge_delay(health, live))
    policy = MidstreamPolicy(
        routing.midstream,
        first_byte_s=routing.ttft_timeout_s or config.timeouts.first_byte,
        idle_s=config.timeouts.idle,
        max_resumes=routing.max_resumes,
        report=lambda region, outcome: health.report(region, outcome),
    )
    app[MIDSTREAM] = policy

    def retune(new: RoutingConfig) -> None:
        policy.mode = new.midstream
        policy.max_resumes = new.max_resumes
        policy.first_byte_s = new.ttft_timeout_s or config.timeouts.first_byte

    live.on_change.append(retune)
    reloader = app.get(RELOADER)
    if reloader is not None:
        reloader.register("routing", live.prepare, ("routing",))
    hooks.append(passive_hook(health))
    stages.append(_deadline_stage())
    ready_checks.append(health.any_available)
    app.on_response_prepare.append(_headers_stamp(context_of))
    admin.add_routes(admin.AdminRoutes(app.router, guard))

    async def use_admission(app: web.Application) -> None:
        # Admission (limits.install) holds a slot per attempt until the answer ends: the
        # in-flight count power-of-two-choices compares.
        gates = app.get(ADMISSION)
        if gates is not None:
            health.in_flight_of = gates.in_flight

    app.on_startup.append(use_admission)
    return selector(health, live)
