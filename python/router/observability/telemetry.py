"""Observability in the app: timing middleware, Server-Timing, routes, passive region view."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from router.core.context import RequestContext, request_id
from router.observability import metrics, status
from router.observability.access_log import AccessLog, AccessRecord, CacheResult
from router.observability.metrics import RegionSource, RegionState, Telemetry
from router.observability.slo import SloTargets, SloTracker
from router.observability.timing import CONNECT, REGION_TTFT, TOTAL, TTFT, server_timing, totals

if TYPE_CHECKING:
    from router.config import ObservabilityConfig
    from router.core.proxy import AttemptError
    from router.core.upstream import Upstream

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Reads the request's context (the core's CONTEXT request key) and cache outcome.
ContextOf = Callable[[web.Request], RequestContext | None]
CacheOf = Callable[[web.Request], CacheResult]

TELEMETRY: web.AppKey[Telemetry] = web.AppKey("telemetry", Telemetry)


class _Exchange:
    """What the timing middleware keeps of one request (one request key, no lookups that miss)."""

    __slots__ = ("answer", "at_headers", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        # Stage durations fixed when the headers went out, so the header and the log agree.
        self.at_headers: dict[str, int] | None = None
        self.answer: web.StreamResponse | None = None


_EXCHANGE: web.RequestKey[_Exchange] = web.RequestKey("router.obs.exchange")
_ATTEMPTS = "obs.regions"  # ctx.extra: region names tried, in order
_TENANT = "tenant"  # ctx.extra key the auth stage fills (an auth.Tenant)
# ctx.extra key the hedger (hedge.HEDGED) sets to the region a hedged request went to; not
# imported from there because hedge -> proxy -> upstream -> here would be a cycle.
HEDGED = "routing.hedged"

log = logging.getLogger("router")

# nginx's code for "the client closed the connection before the answer".
CLIENT_CLOSED = 499


class PassiveHealth:
    """Region health as the request path last saw it: down after a failed connect or timeout."""

    __slots__ = ("_down", "_ejections", "names")

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self._down: dict[str, bool] = {}
        self._ejections: dict[str, int] = {}

    def saw(self, region: str, reachable: bool) -> None:
        """Record one attempt's outcome; a flip to down counts as an ejection."""
        was_down = self._down.get(region)
        self._down[region] = not reachable
        if not reachable and was_down is not True:
            self._ejections[region] = self._ejections.get(region, 0) + 1

    def states(self) -> list[RegionState]:
        """Every configured region; health unknown until traffic reached it."""
        out = []
        for name in self.names:
            down = self._down.get(name)
            out.append(
                RegionState(
                    name,
                    None if down is None else not down,
                    ejections=self._ejections.get(name, 0),
                )
            )
        return out


def _stamp_factory(context_of: ContextOf) -> Callable[..., Awaitable[None]]:
    async def stamp(request: web.BaseRequest, response: web.StreamResponse) -> None:
        """on_response_prepare: Server-Timing with the stages known when the headers go out."""
        exchange = request.get(_EXCHANGE)
        if exchange is None:
            return
        ctx = context_of(request) if isinstance(request, web.Request) else None
        durations = exchange.at_headers
        if durations is None:
            # Sent before the middleware saw it. A whole body leaves with its headers, so first
            # byte and total are now; a stream's body follows, so its total is not known yet.
            durations = totals(ctx.timer.stages) if ctx is not None else {}
            durations[TTFT] = time.perf_counter_ns() - exchange.start
            if isinstance(response, web.Response):
                durations[TOTAL] = durations[TTFT]
            exchange.at_headers = durations
        response.headers["Server-Timing"] = server_timing(durations)
        if ctx is not None and "X-Request-Id" not in response.headers:
            response.headers["X-Request-Id"] = ctx.request_id

    return stamp


def _record(
    request: web.Request,
    ctx: RequestContext,
    status_code: int,
    durations: dict[str, int],
    cache: CacheResult,
    tokens: tuple[int | None, int | None],
) -> AccessRecord:
    parsed = ctx.parsed
    tenant = ctx.extra.get(_TENANT)
    regions = ctx.extra.get(_ATTEMPTS)
    tried: list[str] = regions if isinstance(regions, list) else []
    hedges = 1 if isinstance(ctx.extra.get(HEDGED), str) else 0
    # A hedge also tries a second region, but alongside the first, not after it failed.
    failovers = max(0, sum(1 for a, b in itertools.pairwise(tried) if a != b) - hedges)
    return AccessRecord(
        request_id=ctx.request_id,
        method=request.method,
        path=request.path,
        status=status_code,
        tenant=getattr(tenant, "name", None),
        model=parsed.model if parsed is not None else None,
        region=ctx.region,
        attempts=ctx.attempts,
        retries=max(0, ctx.attempts - 1 - failovers),
        failovers=failovers,
        hedges=hedges,
        cache=cache,
        stream=parsed.stream if parsed is not None else False,
        stages=durations,
        tokens_in=tokens[0],
        tokens_out=tokens[1],
    )


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None


_USAGE = msgspec.json.Decoder(_WithUsage)


def usage(resp: web.StreamResponse) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens a whole JSON answer reports; (None, None) for streams."""
    body = resp.body if isinstance(resp, web.Response) else None
    if not isinstance(body, bytes) or b'"usage"' not in body:
        return None, None
    try:
        found = _USAGE.decode(body).usage
    except msgspec.MsgspecError:
        return None, None
    if found is None:
        return None, None
    return found.prompt_tokens, found.completion_tokens


class _Failures:
    """Logs the first failure to record a request with its traceback, then every 1000th."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def note(self) -> None:
        self.count += 1
        if self.count == 1 or self.count % 1000 == 0:
            log.exception("observability: could not record a request (%d so far)", self.count)


def _middleware_factory(
    telemetry: Telemetry, context_of: ContextOf, cache_of: CacheOf
) -> Middleware:
    failures = _Failures()

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Times the whole request; one access record per proxied request once it is done."""
        start = time.perf_counter_ns()
        exchange = _Exchange(start)
        request[_EXCHANGE] = exchange
        token = _CURRENT.set(lambda: context_of(request))
        code = 500
        try:
            resp = await handler(request)
            exchange.answer = resp
            code = resp.status
            if not resp.prepared:
                # A whole body: it leaves right after this, so first byte and total are now.
                now = time.perf_counter_ns() - start
                ctx = context_of(request)
                durations = totals(ctx.timer.stages) if ctx is not None else {}
                durations[TTFT] = durations[TOTAL] = now
                exchange.at_headers = durations
            return resp
        except asyncio.CancelledError:
            code = CLIENT_CLOSED
            raise
        except web.HTTPException as exc:
            code = exc.status
            raise
        finally:
            _CURRENT.reset(token)
            ctx = context_of(request)
            answer = exchange.answer
            if ctx is None and request.method == "POST" and request.path.startswith("/v1/"):
                # Refused before the handler made a context (auth): still a request to count.
                # The id an error answer already carries, else the client's or a new one.
                rid = answer.headers.get("X-Request-Id") if answer is not None else None
                ctx = RequestContext(
                    rid or request_id(request.headers.get("X-Request-Id")), request.path
                )
            if ctx is not None:
                at_headers = exchange.at_headers or {}
                if TOTAL in at_headers:
                    # A whole body: everything was fixed with its headers, which showed the same.
                    durations = at_headers
                else:
                    # A stream (or no answer): the body's stages have ended by now.
                    durations = totals(ctx.timer.stages)
                    if TTFT in at_headers:
                        durations[TTFT] = at_headers[TTFT]
                    durations[TOTAL] = time.perf_counter_ns() - start
                tokens = usage(answer) if answer is not None else (None, None)
                try:
                    record = _record(request, ctx, code, durations, cache_of(request), tokens)
                    telemetry.finish(record)
                except Exception:
                    # Observability must never cost a client its answer (e.g. stdout closed).
                    failures.note()

    return observe


# The running request's context, for the upstream pool's connect hook: it runs in the request's
# task but is handed only the pool.
_CURRENT: ContextVar[Callable[[], RequestContext | None] | None] = ContextVar(
    "router.obs.current", default=None
)


def record_connect(ns: int) -> None:
    """Add a new upstream connection's time (TCP + TLS) to the running request's `connect` stage.

    A reused keep-alive connection costs nothing and records nothing.
    """
    current = _CURRENT.get()
    ctx = current() if current is not None else None
    if ctx is not None:
        ctx.timer.record(CONNECT, ns)


def attempt_hook(
    passive: PassiveHealth | None,
) -> Callable[[RequestContext, Upstream, AttemptError | None, float], None]:
    """An attempt hook: regions tried (failovers), region TTFT, passive reachability."""

    def hook(
        ctx: RequestContext, upstream: Upstream, error: AttemptError | None, seconds: float
    ) -> None:
        tried = ctx.extra.get(_ATTEMPTS)
        if isinstance(tried, list):
            tried.append(upstream.name)
        else:
            ctx.extra[_ATTEMPTS] = [upstream.name]
        if error is None:
            # Connect + request + the region's first byte (the first SSE chunk for a stream).
            ctx.timer.record(REGION_TTFT, int(seconds * 1e9))
        if passive is not None:
            unreachable = error is not None and error.kind in ("connect", "timeout")
            passive.saw(upstream.name, not unreachable)

    return hook


class RegionHealthView(Protocol):
    """What the status needs of one region's health (router.native.RegionHealth has it)."""

    @property
    def available(self) -> bool: ...
    @property
    def ewma_rtt_s(self) -> float | None: ...
    @property
    def ejections(self) -> int: ...


class HealthView(Protocol):
    """What the status needs of the health feature (router.health.Health has it)."""

    def snapshot(self) -> Mapping[str, RegionHealthView]: ...


Count = Callable[[str], int]


def health_source(
    health: HealthView, in_flight: Count | None = None, queue_depth: Count | None = None
) -> RegionSource:
    """Region gauges from the health snapshot and admission's counts, read at scrape time."""

    def states() -> list[RegionState]:
        return [
            RegionState(
                name,
                h.available,
                h.ewma_rtt_s,
                in_flight(name) if in_flight is not None else 0,
                queue_depth(name) if queue_depth is not None else 0,
                h.ejections,
            )
            for name, h in health.snapshot().items()
        ]

    return states


def use_health(
    app: web.Application,
    health: HealthView,
    in_flight: Count | None = None,
    queue_depth: Count | None = None,
) -> None:
    """Show the health feature's view (probes, ejections) instead of the passive one."""
    app[TELEMETRY].regions = health_source(health, in_flight, queue_depth)


async def _adopt_health(app: web.Application) -> None:
    """on_startup: once every feature is installed, prefer the prober's view when there is one."""
    from router.routing.admission import ADMISSION
    from router.server.admin import HEALTH

    health = app.get(HEALTH)
    if health is None:
        return
    gates = app.get(ADMISSION)
    if gates is None:
        use_health(app, health)
    else:
        use_health(app, health, gates.in_flight, gates.depth)


def telemetry_from_config(
    config: ObservabilityConfig,
    regions: RegionSource | None = None,
    models: Iterable[str] | None = None,
) -> Telemetry:
    """Telemetry for the [observability] section."""
    targets = SloTargets(
        ttft_p95_s=config.slo_ttft_p95_ms / 1000.0,
        error_rate=config.slo_error_rate,
        window_s=config.slo_window_s,
    )
    log = AccessLog(
        level=config.log_level,
        fmt=config.log_format,
        enabled=config.access_log,
        flush_interval_s=config.access_log_flush_ms / 1000.0,
    )
    slo = SloTracker(targets, alpha=config.quantile_accuracy)
    return Telemetry(slo=slo, regions=regions, log=log, models=models)


def no_cache(request: web.Request) -> CacheResult:
    """The cache outcome when the response cache is not installed."""
    return "none"


def cache_result(request: web.Request) -> CacheResult:
    """The response cache's outcome for this request (`none` when the cache did not run)."""
    from router.cache.serving import MARK  # only when the cache is installed

    mark = request.get(MARK)
    if mark is None:
        return "none"
    outcome = mark.outcome.value.lower()
    if outcome == "hit":
        return "hit"
    if outcome == "miss":
        return "miss"
    return "bypass" if outcome == "bypass" else "none"


def _close_log(telemetry: Telemetry) -> Callable[[web.Application], Awaitable[None]]:
    async def close(app: web.Application) -> None:
        """on_cleanup: the buffered access lines are written before the process exits."""
        if telemetry.log is not None:
            telemetry.log.close()

    return close


def install(
    app: web.Application,
    config: ObservabilityConfig,
    *,
    context_of: ContextOf,
    hooks: list[Callable[[RequestContext, Upstream, AttemptError | None, float], None]],
    region_names: Iterable[str],
    models: Iterable[str] | None = None,
    cache_of: CacheOf = cache_result,
    regions: RegionSource | None = None,
) -> Telemetry | None:
    """Add the timing middleware (outermost), Server-Timing, /metrics, /status, /status.json.

    Region gauges come from `regions` if given, else from the health feature's snapshot (found
    at startup), else from what the request path last saw (PassiveHealth). `models` (the served
    names) bounds the model label. Nothing at all when [observability] enabled = false.
    """
    if not config.enabled:
        return None
    passive = PassiveHealth(region_names)
    telemetry = telemetry_from_config(config, regions or passive.states, models)
    app[TELEMETRY] = telemetry
    hooks.append(attempt_hook(passive))
    # Outermost, so it also times and sees the error responses the inner middlewares render.
    app.middlewares.insert(0, _middleware_factory(telemetry, context_of, cache_of))
    app.on_response_prepare.append(_stamp_factory(context_of))
    if regions is None:
        app.on_startup.append(_adopt_health)
    app.on_cleanup.append(_close_log(telemetry))
    metrics.add_routes(app, telemetry)
    status.add_routes(app, telemetry, refresh_ms=config.status_refresh_ms)
    return telemetry
