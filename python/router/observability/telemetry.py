"""Observability on the request path: Server-Timing, the access record, passive region view."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from aiohttp import web

from router.access.usage import reported_usage
from router.config import ObservabilityConfig
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind, unreachable
from router.core.timing import REGION_TTFT, TOTAL, TTFT, server_timing
from router.core.upstream import Upstream
from router.observability import metrics, status
from router.observability.access_log import AccessLog, AccessRecord, CacheResult
from router.observability.build import build_info
from router.observability.metrics import RegionSource, RegionState, Telemetry
from router.observability.region_attempts import BROKEN, OK, outcome_of
from router.observability.slo import SloTargets, SloTracker

log = logging.getLogger("router")


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


def usage(
    resp: web.StreamResponse, reported: Sequence[bytes] = ()
) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens the answer reports: a whole JSON answer in its body, a
    relayed stream in the events that carried `usage` (`ctx.reported`: the latest has the
    counts, an earlier one the input tokens where the API reports them apart); (None, None)
    when it reports none."""
    if isinstance(resp, web.Response):
        body = resp.body
        found = reported_usage(body) if isinstance(body, bytes) else None
        return (None, None) if found is None else (found.prompt, found.completion)
    prompt = completion = None
    for payload in reported:
        found = reported_usage(payload)
        if found is not None:
            prompt = found.prompt if found.prompt is not None else prompt
            completion = found.completion if found.completion is not None else completion
    return prompt, completion


class _Failures:
    """Logs the first failure to record a request with its traceback, then every 1000th."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def note(self) -> None:
        self.count += 1
        if self.count == 1 or self.count % 1000 == 0:
            log.exception("observability: could not record a request (%d so far)", self.count)


_CACHE_RESULTS: dict[str, CacheResult] = {"HIT": "hit", "MISS": "miss", "BYPASS": "bypass"}


def cache_result(ctx: RequestContext) -> CacheResult:
    """The response cache's outcome for this request (`none` when the cache did not run)."""
    mark = ctx.cache
    if mark is None:
        return "none"
    return _CACHE_RESULTS.get(mark.outcome, "none")


def record_of(
    request: web.Request,
    ctx: RequestContext,
    status_code: int,
    durations: dict[str, int],
    tokens: tuple[int | None, int | None],
) -> AccessRecord:
    """The access record of one finished request."""
    parsed = ctx.parsed
    tenant = ctx.tenant
    hedges = 1 if ctx.hedged is not None else 0
    # A hedge also tries a second region, but alongside the first, not after it failed.
    failovers = ctx.failovers
    return AccessRecord(
        request_id=ctx.request_id,
        method=request.method,
        path=request.path,
        status=status_code,
        tenant=tenant.name if tenant is not None else None,
        model=parsed.model if parsed is not None else None,
        version=ctx.assignment.version if ctx.assignment is not None else None,
        region=ctx.region,
        attempts=ctx.attempts,
        retries=max(0, ctx.attempts - 1 - failovers),
        failovers=failovers,
        hedges=hedges,
        cache=cache_result(ctx),
        stream=parsed.stream if parsed is not None else False,
        stages=durations,
        tokens_in=tokens[0],
        tokens_out=tokens[1],
        error=ctx.broken,
        drained=ctx.shut_down,
        refused=refused(ctx, status_code),
    )


def refused(ctx: RequestContext, status: int) -> bool:
    """Whether the router answered itself because its admission was full at the last region
    tried (core.attempt: a spill raised as the request's failure is admission's 503; a region's
    503 is never an answer, always a failed attempt, so a 503 after a spill is the router's)."""
    return status == 503 and ctx.last_failure == FailureKind.SPILL


class Observer:
    """Server-Timing on every answer of a proxied request, one access record when it ends."""

    __slots__ = ("_failures", "passive", "telemetry")

    def __init__(self, telemetry: Telemetry, passive: PassiveHealth) -> None:
        self.telemetry = telemetry
        self.passive = passive
        self._failures = _Failures()

    def stamp(self, ctx: RequestContext, response: web.StreamResponse) -> None:
        """Server-Timing with the stages known when the headers go out."""
        durations = ctx.at_headers
        if durations is None:
            # A whole body leaves with its headers, so first byte and total are now; a
            # stream's body follows, so its total is not known yet.
            durations = dict(ctx.timer.durations)
            durations[TTFT] = ctx.timer.elapsed_ns()
            if isinstance(response, web.Response):
                durations[TOTAL] = durations[TTFT]
            ctx.at_headers = durations
        response.headers["Server-Timing"] = server_timing(durations)
        if "X-Request-Id" not in response.headers:
            response.headers["X-Request-Id"] = ctx.request_id

    def finish(
        self,
        request: web.Request,
        ctx: RequestContext,
        status: int,
        answer: web.StreamResponse | None,
    ) -> None:
        """One access record (metrics, SLO, log line) for the finished request, and the counts
        of its attempts (`count_attempts`)."""
        self.count_attempts(ctx)
        at_headers = ctx.at_headers or {}
        if TOTAL in at_headers:
            # A whole body: everything was fixed with its headers, which showed the same.
            durations = at_headers
        else:
            # A stream (or no answer): the body's stages have ended by now.
            durations = dict(ctx.timer.durations)
            if TTFT in at_headers:
                durations[TTFT] = at_headers[TTFT]
            durations[TOTAL] = ctx.timer.elapsed_ns()
        tokens = usage(answer, ctx.reported) if answer is not None else (None, None)
        try:
            self.telemetry.finish(record_of(request, ctx, status, durations, tokens))
        except Exception:
            # Observability must never cost a client its answer (e.g. stdout closed).
            self._failures.note()

    def count_attempts(self, ctx: RequestContext) -> None:
        """Count the request's attempts noted so far, once its answer left; later ones (a
        hedge's loser let go of) are counted at once."""
        outcomes = ctx.outcomes
        ctx.outcomes = None
        if outcomes:
            metrics = self.telemetry.metrics
            for region, outcome in outcomes:
                metrics.attempt(region, outcome)

    def attempt(
        self, ctx: RequestContext, upstream: Upstream, error: AttemptError | None, seconds: float
    ) -> None:
        """An attempt observer: regions tried (failovers), region TTFT, passive reachability,
        the region's attempt counts."""
        name = upstream.name
        ctx.tried.append(name)
        if error is None:
            # Connect + request + the region's first byte (the first SSE chunk for a stream).
            ctx.timer.record(REGION_TTFT, int(seconds * 1e9))
            # A stream's first byte is not yet a success: counted when it broke or went through.
            outcome = None if ctx.request.stream else OK
        else:
            outcome = outcome_of(error)
        if outcome is not None:
            outcomes = ctx.outcomes
            if outcomes is not None:
                outcomes.append((name, outcome))  # counted by `finish`, after the answer left
            else:
                self.telemetry.metrics.attempt(name, outcome)
        self.passive.saw(name, error is None or not unreachable(error.kind))

    def broke(self, ctx: RequestContext, region: str, model: str) -> None:
        """A StreamObserver: the stream from `region` broke after its first byte."""
        self.telemetry.metrics.attempt(region, BROKEN)

    def went_through(self, ctx: RequestContext, region: str, model: str, ttft_s: float) -> None:
        """A StreamObserver: the stream from `region` did not break (or its client left)."""
        self.telemetry.metrics.attempt(region, OK)

    def ended(self, ctx: RequestContext) -> None:
        """A StreamObserver: the request's attempts are over (its streams are counted)."""


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


def telemetry_from_config(
    config: ObservabilityConfig,
    regions: RegionSource | None = None,
    models: Iterable[str] | None = None,
    shared_stream: bool = False,
) -> Telemetry:
    """Telemetry for the [observability] section; `shared_stream`: other processes write to
    the same stdout (workers), so access lines go out in atomic whole-line writes."""
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
        shared_stream=shared_stream,
    )
    slo = SloTracker(targets, alpha=config.quantile_accuracy)
    return Telemetry(slo=slo, regions=regions, log=log, models=models, build=build_info())


def build(
    config: ObservabilityConfig,
    region_names: Iterable[str],
    models: Iterable[str] | None = None,
    shared_stream: bool = False,
) -> Observer | None:
    """The observer for the [observability] section; None when it is disabled."""
    if not config.enabled:
        return None
    passive = PassiveHealth(region_names)
    return Observer(telemetry_from_config(config, passive.states, models, shared_stream), passive)


def add_routes(
    app: web.Application,
    observer: Observer,
    config: ObservabilityConfig,
    routes: web.Application | None = None,
) -> None:
    """/metrics, /status, /status.json on `routes` (default `app`); the access log is flushed
    when `app` stops."""
    telemetry = observer.telemetry
    metrics.add_routes(routes or app, telemetry)
    status.add_routes(routes or app, telemetry, refresh_ms=config.status_refresh_ms)

    async def close(app: web.Application) -> None:
        # The buffered access lines are written before the process exits.
        if telemetry.log is not None:
            telemetry.log.close()

    app.on_cleanup.append(close)
