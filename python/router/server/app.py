"""build_app(config): every feature built once, in dependency order, into the one pipeline."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from router.access import tokenizers
from router.access.auth import Authenticator
from router.access.limits import Limiter, Limits, auth_preparer, rate_limit_headers
from router.cache.serving import CacheLayer, cache_headers
from router.config import Config
from router.core.admin import AdminRoutes
from router.core.client_limit import InFlightPerIp
from router.core.context import request_id
from router.core.pipeline import CONTEXT, Features, Pipeline
from router.core.request import CHAT, COMPLETIONS, EMBEDDINGS
from router.core.responses import error_response
from router.core.stages import AttemptObserver, ResponseDecorator
from router.errors import ApiError, InvalidRequest, NotFound
from router.observability import telemetry
from router.rollout import admin as rollout_admin
from router.rollout.runtime import ROLLOUT, RolloutRuntime, canary_hook, version_header
from router.routing import admin as routing_admin
from router.routing.admission import Admission
from router.routing.circuit import Circuits
from router.routing.continuation import MidstreamPolicy
from router.routing.fallback import Fallbacks
from router.routing.health import Health, lifetime
from router.routing.hedge import hedger
from router.routing.runtime import (
    LiveRouting,
    RetryState,
    hedge_delay,
    passive_hook,
    routing_headers,
    selector,
)
from router.server import reload
from router.server.pools import POOLS, RegionPools, regions_preparer
from router.server.reload import RELOADER, LiveConfig, Reloader, health_preparer, sighup_ctx

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


def _models_body(config: Config) -> bytes:
    """GET /v1/models, computed from a config."""
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "router"}
        for name in config.served_models()
    ]
    return msgspec.json.encode({"object": "list", "data": data})


def _errors(pipeline: Pipeline) -> Middleware:
    """Errors outside the pipeline leave in OpenAI's shape too: aiohttp's 404/405, and bugs. A
    POST to an unknown /v1/ path goes through the pipeline's own 404 (auth first, logged)."""

    @web.middleware
    async def errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc, _request_id(request))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            if exc.status == 404 and request.method == "POST" and request.path.startswith("/v1/"):
                return await pipeline.unknown(request)
            error: ApiError = (
                NotFound(f"Unknown path {request.path}.")
                if exc.status == 404
                else InvalidRequest(exc.reason, status=exc.status, code=None)
            )
            return error_response(error, _request_id(request))
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            return error_response(ApiError("Internal router error."), _request_id(request))

    return errors


def _request_id(request: web.Request) -> str:
    ctx = request.get(CONTEXT)
    return ctx.request_id if ctx is not None else request_id(request.headers.get("X-Request-Id"))


def build_app(config: Config, config_path: Path | None = None) -> web.Application:
    """The router application for `config`; pools and probes start with it and stop with it."""
    # client_max_size is a backstop; read_body enforces max_body_bytes with a proper 413.
    app = web.Application(client_max_size=config.server.max_body_bytes + 1)
    app[CONFIG] = config
    state = app[STATE] = RouterState()
    live = LiveConfig(config, config_path)
    reloader = app[RELOADER] = Reloader(live)
    app.cleanup_ctx.append(sighup_ctx(reloader))
    pools = app[POOLS] = RegionPools.opening(config)
    app.cleanup_ctx.append(pools.lifetime)

    # Who asks: one authenticator, whose admin check also guards every admin route.
    auth = Authenticator.from_config(config.auth)
    auth.warn_if_disabled()
    admin = AdminRoutes(app.router, auth.check_admin)
    # Which version: the rollout table and its canary monitor.
    rollout = app[ROLLOUT] = RolloutRuntime(config)
    reloader.register("rollout", rollout.prepare_reload, ("rollout", "models"))
    # How much: per-key limits, then per-region admission slots.
    limiter = Limiter.from_config(
        config.limits, auth.tenants, tokenizers.load(config.tokenizers.models)
    )
    reloader.register("auth", auth_preparer(auth, limiter), ("auth",))
    app.cleanup_ctx.append(_closing(limiter.close))
    admission = Admission.from_config(config.admission)
    # Where: health (probes + passive), nearest-healthy selection, retries, hedges, continuation.
    health = app[routing_admin.HEALTH] = Health(config.health, config.regions)
    health.in_flight_of = admission.in_flight
    app.cleanup_ctx.append(lifetime(health))
    reloader.register("health", health_preparer(health), ("health",))
    reloader.register("regions", regions_preparer(pools, health), ("regions",))
    routing = LiveRouting(config.routing)
    reloader.register("routing", routing.prepare, ("routing",))
    fallbacks = Fallbacks(config.models)
    reloader.register("fallbacks", fallbacks.prepare_reload, ("models",))
    circuits = Circuits(
        config.routing.circuit_after, config.routing.circuit_base_s, config.routing.circuit_max_s
    )
    midstream = MidstreamPolicy(
        config.routing.midstream,
        idle_s=config.timeouts.idle,
        max_resumes=config.routing.max_resumes,
        report=lambda region, outcome: health.report(region, outcome),
    )
    routing.on_change.append(midstream.retune)
    # What it cost: Server-Timing, metrics, access log, SLOs, the status page.
    observer = telemetry.build(
        config.observability, [r.name for r in config.regions], config.served_models()
    )
    observers: list[AttemptObserver] = []
    if observer is not None:
        observer.telemetry.regions = telemetry.health_source(
            health, admission.in_flight, admission.depth
        )
        observers.append(observer.attempt)
        telemetry.add_routes(app, observer, config.observability)
    observers += [canary_hook(rollout), passive_hook(health, circuits)]
    # Answers already known: the response cache.
    cache = None
    if config.cache.enabled:
        cache = CacheLayer(config)
        app.cleanup_ctx.append(cache.lifetime)
        cache.add_routes(app, auth.check_admin)
    decorators: list[ResponseDecorator] = [version_header, rate_limit_headers, routing_headers]
    if cache is not None:
        decorators.append(cache_headers)

    features = Features(
        auth=auth,
        rollout=rollout,
        filters=(Limits(auth, limiter),),
        retry=RetryState(routing),
        selector=selector(health, routing, circuits),
        slots=admission,
        observers=tuple(observers),
        hedger=hedger(lambda: routing.config.hedge_endpoints, hedge_delay(health, routing)),
        continuer=midstream,
        cache=cache,
        fallbacks=fallbacks,
        decorators=tuple(decorators),
        exchange=observer,
    )
    pipeline = app[PIPELINE] = Pipeline(
        features, live, pools, InFlightPerIp(config.server.max_in_flight_per_ip)
    )

    app.on_response_prepare.append(pipeline.on_prepare)
    app.middlewares.append(_errors(pipeline))
    for endpoint in (CHAT, COMPLETIONS, EMBEDDINGS):
        app.router.add_post(endpoint, pipeline.handler(endpoint))

    async def models(request: web.Request) -> web.Response:
        auth.authenticate(request.headers)
        # From the live config, so models added or removed by a reload show up at once.
        body = _models_body(live.config)
        return web.Response(body=body, content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        if state.draining:
            return web.json_response({"status": "draining"}, status=503)
        if not health.any_available():
            return web.json_response({"status": "not ready"}, status=503)
        return web.json_response({"status": "ready"})

    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    routing_admin.add_routes(admin)
    rollout_admin.add_routes(admin)
    reload.add_routes(admin)
    return app


def _closing(
    close: Callable[[], Awaitable[None]],
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx entry that awaits `close()` when the app stops."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        await close()

    return ctx
