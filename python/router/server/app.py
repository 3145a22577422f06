"""build_app(config): every feature built once, in dependency order, into the one pipeline."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware

from router.access import tokenizers
from router.access.auth import Authenticator
from router.access.limits import Limiter, Limits, auth_preparer, rate_limit_headers
from router.cache.admin import CACHE
from router.cache.serving import CacheLayer, cache_headers
from router.config import Commit, Config, Preparer
from router.core.admin import AdminRoutes
from router.core.client_limit import InFlightPerIp
from router.core.context import request_id
from router.core.dialect import DIALECTS, dialect_of
from router.core.open_streams import OpenStreams
from router.core.pipeline import CONTEXT, Features, Pipeline
from router.core.request import RESPONSES, unreadable_body
from router.core.responses import error_response
from router.core.stages import AttemptObserver, ResponseDecorator
from router.errors import ApiError, InvalidRequest, NotFound
from router.observability import telemetry
from router.observability.metrics import Metrics
from router.observability.tracing import Tracing
from router.observability.tracing import lifetime as tracing_lifetime
from router.rollout import admin as rollout_admin
from router.rollout.runtime import ROLLOUT, RolloutRuntime, canary_hook, version_header
from router.routing import admin as routing_admin
from router.routing.admission import Admission
from router.routing.affinity import ResponseHomes
from router.routing.continuation import MidstreamPolicy
from router.routing.fallback import Fallbacks
from router.routing.health import Health, lifetime
from router.routing.hedge import hedger
from router.routing.runtime import (
    LiveRouting,
    PassiveHealth,
    RetryState,
    hedge_delay,
    routing_headers,
    selector,
)
from router.server import dispatch, http_errors, reload
from router.server import models as served
from router.server.machine import Machine, add_machine_routes
from router.server.pools import POOLS, RegionPools, regions_preparer
from router.server.reload import RELOADER, LiveConfig, Reloader, health_preparer, sighup_ctx

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("router")

# Readiness conditions ANDed by /readyz (e.g. "at least one healthy region").
ReadyCheck = Callable[[], bool]


class RouterState:
    """Mutable process-wide flags."""

    __slots__ = ("draining",)

    def __init__(self) -> None:
        self.draining = False


CONFIG: web.AppKey[Config] = web.AppKey("config")
STATE: web.AppKey[RouterState] = web.AppKey("state")
PIPELINE: web.AppKey[Pipeline] = web.AppKey("pipeline")
# The app behind `admin_listen` (/metrics, /status*, /admin/*), set only when that is configured;
# it shares every feature with the client app and starts after it.
ADMIN_APP: web.AppKey[web.Application] = web.AppKey("admin_app")


# A /v1/ request the router does not serve, and the error to answer once it is authenticated
# (the pipeline's, logged), in Anthropic's shape or not.
NotServed = Callable[[web.Request, ApiError, bool], Awaitable[web.StreamResponse]]
MODELS = "/v1/models"


def error_middleware(unknown: NotServed | None = None) -> Middleware:
    """Errors outside the pipeline leave in OpenAI's shape too: aiohttp's 404/405/413, and
    bugs. With `unknown` (the pipeline's: auth first, logged), a /v1/ request for a path the
    router does not serve, or with a method its path does not take, goes there, so a client
    without a key learns nothing of which paths exist."""

    @web.middleware
    async def errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc, _request_id(request), anthropic=_anthropic(request))
        except web.RequestPayloadError:
            # An operator route's body that does not decode or parse (the pipeline's own reads
            # answer the same in core.request.read_body).
            return error_response(unreadable_body(request), _request_id(request))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            error = _not_served(request, exc)
            path = request.path
            v1 = path == "/v1" or path.startswith("/v1/")
            if unknown is not None and exc.status in (404, 405) and v1:
                return await unknown(request, error, _anthropic(request))
            return error_response(error, _request_id(request), anthropic=_anthropic(request))
        except Exception:
            log.exception("unhandled error on %s %r", request.method, request.path)
            error = ApiError("Internal router error.")
            return error_response(error, _request_id(request), anthropic=_anthropic(request))

    return errors


def _not_served(request: web.Request, exc: web.HTTPException) -> ApiError:
    """aiohttp's 404/405/413 as an ApiError; a 405 keeps aiohttp's Allow header."""
    if exc.status == 404:
        return NotFound(f"Unknown path {request.path}.")
    allow = exc.headers.get("Allow")
    headers = {"Allow": allow} if allow is not None else None
    return InvalidRequest(exc.reason, status=exc.status, code=None, headers=headers)


def _anthropic(request: web.Request) -> bool:
    """Whether an error takes Anthropic's shape: on its API's paths, and on the models routes
    both APIs share when the client sends `anthropic-version` (Anthropic's SDK always does)."""
    path = request.path
    if path == MODELS or path.startswith(MODELS + "/"):
        return "anthropic-version" in request.headers
    return dialect_of(path).anthropic


def _request_id(request: web.Request) -> str:
    ctx = request.get(CONTEXT)
    return ctx.request_id if ctx is not None else request_id(request.headers.get("X-Request-Id"))


def build_app(
    config: Config,
    config_path: Path | None = None,
    generation: int = 0,
    span_exporter: SpanExporter | None = None,
    shared_stdout: bool = False,
    machine: Machine | None = None,
) -> web.Application:
    """The router application for `config`; pools and probes start with it and stop with it.
    `generation` is the config generation to start at (a restarted worker's siblings');
    `span_exporter` replaces the OTLP exporter (tests); `shared_stdout`: sibling workers
    write to the same stdout; `machine`: what the workers of the machine share (limits and
    admission counts, region health, the supervisor's machine view)."""
    # Before any route exists: routes take aiohttp's default Expect handler when made.
    http_errors.install()
    # client_max_size is a backstop; read_body enforces max_body_bytes with a proper 413.
    app = web.Application(client_max_size=config.server.max_body_bytes + 1)
    # With an admin listener, operator routes live on their own app so the client listener
    # cannot reach them (and the admin listener serves no /v1).
    # A worker always has them apart: the supervisor asks each worker's on a private socket.
    ops = app
    if config.server.admin_listen is not None or machine is not None:
        ops = app[ADMIN_APP] = web.Application(client_max_size=1 << 20)
    app[CONFIG] = ops[CONFIG] = config
    state = app[STATE] = ops[STATE] = RouterState()
    live = LiveConfig(config, config_path, generation)
    reloader = app[RELOADER] = ops[RELOADER] = Reloader(live, snapshot=machine is not None)
    app.cleanup_ctx.append(sighup_ctx(reloader))
    pools = app[POOLS] = RegionPools.opening(config)
    app.cleanup_ctx.append(pools.lifetime)

    # Who asks: one authenticator, whose admin check also guards every admin route.
    auth = Authenticator.from_config(config.auth)
    auth.warn_if_disabled()
    admin = AdminRoutes(ops.router, auth.check_admin)
    # Which version: the rollout table and its canary monitor.
    rollout = app[ROLLOUT] = ops[ROLLOUT] = RolloutRuntime(config)
    reloader.register("rollout", rollout.prepare_reload, ("rollout", "models"))
    # How much: per-key limits, then per-region admission slots.
    limiter = Limiter.from_config(
        config.limits,
        auth.tenants,
        machine.limits if machine is not None else None,
        tokenizers.load(config.tokenizers.models),
    )
    reloader.register("auth", auth_preparer(auth, limiter), ("auth",))
    app.cleanup_ctx.append(_closing(limiter.close))
    admission = Admission.from_config(
        config.admission, machine.limits if machine is not None else None
    )
    # Where: health (probes + passive), nearest-healthy selection, retries, hedges, continuation.
    health = app[routing_admin.HEALTH] = ops[routing_admin.HEALTH] = Health(
        config.health, config.regions, machine=machine.health if machine is not None else None
    )
    health.in_flight_of = admission.machine_in_flight
    app.cleanup_ctx.append(lifetime(health))
    reloader.register("health", health_preparer(health), ("health",))
    reloader.register("regions", regions_preparer(pools, health), ("regions",))
    routing = LiveRouting(config.routing)
    reloader.register("routing", routing.prepare, ("routing",))
    fallbacks = Fallbacks(config.models)
    reloader.register("fallbacks", fallbacks.prepare_reload, ("models",))
    circuits = routing.circuits
    # Attempt outcomes, and how each stream ended, into region health and the circuits.
    passive = PassiveHealth(health, circuits)
    # What it cost: Server-Timing, metrics, access log, SLOs, the status page.
    observer = telemetry.build(
        config.observability,
        [r.name for r in config.regions],
        config.served_models(),
        shared_stream=shared_stdout,
    )
    observers: list[AttemptObserver] = []
    if observer is not None:
        observer.telemetry.regions = telemetry.health_source(
            health, admission.in_flight, admission.depth
        )
        observer.telemetry.generation = lambda: live.generation
        reloader.register(
            "metric labels",
            _known_models(observer.telemetry.metrics),
            ("models", "rollout", "regions"),
        )
        observers.append(observer.attempt)
        telemetry.add_routes(app, observer, config.observability, routes=ops)
    observers += [canary_hook(rollout), passive]
    # How each stream ended: into region health, and into the regions' attempt counts.
    streams = OpenStreams(passive) if observer is None else OpenStreams(passive, observer)
    midstream = MidstreamPolicy(
        config.routing.midstream,
        max_resumes=config.routing.max_resumes,
        report=streams.broke,
        count_prompt=lambda ctx, exact: limiter.prompt_tokens(ctx.request, exact=exact),
    )
    routing.on_change.append(midstream.retune)
    # Traces (optional): a span per request and per attempt.
    tracing = Tracing.from_config(config.observability, span_exporter)
    if tracing is not None:
        observers.append(tracing.attempt)
        app.cleanup_ctx.append(tracing_lifetime(tracing))
    # Answers already known: the response cache.
    cache = None
    if config.cache.enabled:
        cache = CacheLayer(config)
        app.cleanup_ctx.append(cache.lifetime)
        cache.add_routes(ops, auth.check_admin, lambda name: live.config.upstream_models(name))
        if ops is not app:
            ops.on_startup.append(_sharing_cache(app))
    decorators: list[ResponseDecorator] = [version_header, rate_limit_headers, routing_headers]
    if cache is not None:
        decorators.append(cache_headers)

    homes = ResponseHomes(config.state, machine.pins if machine is not None else None)
    app.cleanup_ctx.append(homes.lifetime)
    features = Features(
        auth=auth,
        rollout=rollout,
        filters=(Limits(auth, limiter),),
        retry=RetryState(routing),
        selector=selector(health, routing, circuits),
        slots=admission,
        observers=tuple(observers),
        streams=streams,
        hedger=hedger(lambda: routing.config.hedge_endpoints, hedge_delay(health, routing)),
        continuer=midstream,
        cache=cache,
        fallbacks=fallbacks,
        decorators=tuple(decorators),
        exchange=observer,
        # Which region holds each stored Responses API response (pinning its follow-ups).
        homes=homes,
    )
    pipeline = app[PIPELINE] = Pipeline(
        features, live, pools, InFlightPerIp(config.server.max_in_flight_per_ip)
    )

    app.on_response_prepare.append(pipeline.on_prepare)
    if tracing is not None:
        # Outermost, so the request span sees the status every other layer settled on.
        app.middlewares.append(tracing.middleware())
    errors = error_middleware(pipeline.unknown)
    app.middlewares.append(errors)
    # 100-continue only for a body that fits (else its 413 at once); other expectations: 417.
    expect = http_errors.expect_handler(lambda: live.config.server.max_body_bytes)
    forwarded = {
        endpoint: app.router.add_post(endpoint, pipeline.handler(endpoint), expect_handler=expect)
        for endpoint in DIALECTS
    }
    if tracing is None:
        # The error middleware is the only one: the forwarded routes skip aiohttp's resolve.
        dispatch.install(app, forwarded, errors)
    # A stored Responses API response, asked for again at the region that holds it.
    stored = RESPONSES + "/{id}"
    app.router.add_get(stored, pipeline.stored)
    app.router.add_delete(stored, pipeline.stored)
    app.router.add_post(stored + "/cancel", pipeline.stored)
    app.router.add_get(stored + "/input_items", pipeline.stored)

    async def models(request: web.Request) -> web.Response:
        anthropic = _anthropic(request)
        try:
            tenant = auth.authenticate(request.headers)
            # From the live config, so models added or removed by a reload show up at once.
            name = request.match_info.get("model")
            if name is None:
                body = served.listing(live.config, tenant, request.query, anthropic)
            else:
                body = served.one(live.config, tenant, name, anthropic)
        except ApiError as exc:
            return error_response(exc, _request_id(request), anthropic=anthropic)
        return web.Response(body=body, content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        if state.draining:
            return web.json_response({"status": "draining"}, status=503)
        if not health.any_available():
            return web.json_response({"status": "not ready"}, status=503)
        return web.json_response({"status": "ready"})

    app.router.add_get(MODELS, models)
    # Ids may hold a slash (`org/model`), sent as is by the SDKs.
    app.router.add_get(MODELS + "/{model:.+}", models)
    for probes in {id(app): app, id(ops): ops}.values():
        probes.router.add_get("/healthz", healthz)
        probes.router.add_get("/readyz", readyz)
    if ops is not app:
        ops.middlewares.append(error_middleware(pipeline.unknown))
    if machine is not None and config.server.admin_listen is None:
        # The client listener's operator routes answer for the machine, not for one worker.
        add_machine_routes(app, machine.socket, auth.check_admin, config.server.body_timeout_s)
    routing_admin.add_routes(admin)
    rollout_admin.add_routes(admin)
    reload.add_routes(admin)
    return app


def check(config: Config) -> None:
    """What build_app refuses about `config` beyond its schema, checked without starting
    anything (`router check-config`, and `router serve` before its workers start): ConfigError.
    """
    Authenticator.from_config(config.auth)
    # The native prober's own rules for [health] and each region's URL and probe path.
    Health(config.health, config.regions)
    tokenizers.load(config.tokenizers.models)


def _known_models(metrics: Metrics) -> Preparer:
    """Reload preparer: models a reload made servable are labelled as themselves in metrics."""

    def prepare(old: Config, new: Config) -> Commit:
        names = new.served_models()
        return lambda: metrics.know_models(names)

    return prepare


def _sharing_cache(app: web.Application) -> Callable[[web.Application], Awaitable[None]]:
    """The admin app's startup hook: the cache the client app opened serves its admin routes."""

    async def share(ops: web.Application) -> None:
        ops[CACHE] = app[CACHE]

    return share


def _closing(
    close: Callable[[], Awaitable[None]],
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx entry that awaits `close()` when the app stops."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        await close()

    return ctx
