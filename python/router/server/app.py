"""build_app(config): the aiohttp application, its typed state and the request handlers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import msgspec
from aiohttp import web

from router.access import limits
from router.access.auth import Authenticator
from router.access.client_limit import InFlightPerIp
from router.cache import serving as cache_http
from router.config import Config
from router.core.context import RequestContext, request_id
from router.core.proxy import AttemptHook, Tap, error_response, forward
from router.core.request import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    check_content_type,
    parse_body,
    read_body,
)
from router.core.upstream import Upstream, Upstreams, open_upstreams
from router.errors import ApiError, InvalidRequest, NotFound, Unavailable
from router.observability import telemetry as observability
from router.rollout import admin as rollout_admin
from router.rollout.runtime import ROLLOUT, RolloutRuntime, canary_hook, tag_response
from router.routing import runtime as routing
from router.server.admin import HEALTH, AdminRoutes, Guard
from router.server.pools import POOLS, RegionPools, regions_preparer
from router.server.reload import RELOADER, LiveConfig, Reloader, health_preparer, sighup_ctx

log = logging.getLogger("router")

# Orders the regions to try for one request; the health/routing feature replaces the default.
Selector = Callable[[RequestContext, Upstreams], Sequence[Upstream]]
# A step run on every proxied request in list order, after parsing and before selection. It may
# change ctx (tenant, deployment, ...), raise an ApiError, or answer itself (a cache hit).
Stage = Callable[[web.Request, RequestContext], Awaitable[web.StreamResponse | None]]
# Region selection + forward for the request at hand; a tap sees what it sends the client.
Origin = Callable[[Tap | None], Awaitable[web.StreamResponse]]
# Wraps the origin after every stage: the response cache (lookup, miss tee, coalescing).
Around = Callable[[web.Request, RequestContext, Origin], Awaitable[web.StreamResponse]]
# Readiness conditions ANDed by /readyz (e.g. "at least one healthy region").
ReadyCheck = Callable[[], bool]


class RouterState:
    """Mutable process-wide flags."""

    __slots__ = ("draining",)

    def __init__(self) -> None:
        self.draining = False


CONFIG: web.AppKey[Config] = web.AppKey("config")
UPSTREAMS: web.AppKey[Upstreams] = web.AppKey("upstreams")
SELECTOR: web.AppKey[Selector] = web.AppKey("selector")
STAGES: web.AppKey[list[Stage]] = web.AppKey("stages")
ATTEMPT_HOOKS: web.AppKey[list[AttemptHook]] = web.AppKey("attempt_hooks")
READY_CHECKS: web.AppKey[list[ReadyCheck]] = web.AppKey("ready_checks")
AROUND: web.AppKey[Around] = web.AppKey("around")
STATE: web.AppKey[RouterState] = web.AppKey("state")
CONTEXT: web.RequestKey[RequestContext] = web.RequestKey("context")


def config_order(ctx: RequestContext, upstreams: Upstreams) -> Sequence[Upstream]:
    """Default selection: regions serving the model, by bias_ms then weight then config order."""
    return upstreams.serving(ctx.request.upstream_model)


def _models_body(config: Config) -> bytes:
    """GET /v1/models, computed once."""
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "router"}
        for name in config.served_models()
    ]
    return msgspec.json.encode({"object": "list", "data": data})


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error leaves in OpenAI's shape: ApiErrors, aiohttp's own 404/405, and bugs (500)."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc, _request_id(request))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error: ApiError = (
            NotFound(f"Unknown path {request.path}.")
            if exc.status == 404
            else InvalidRequest(exc.reason, status=exc.status, code=None)
        )
        return error_response(error, _request_id(request))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(ApiError("Internal router error."), _request_id(request))


def _request_id(request: web.Request) -> str:
    ctx = request.get(CONTEXT)
    return ctx.request_id if ctx is not None else request_id(request.headers.get("X-Request-Id"))


async def _send_whole(request: web.Request, answer: web.StreamResponse) -> None:
    """Send a whole answer now, so the middlewares' bookkeeping on the way out (usage, limits,
    metrics, access log) runs after the client has it instead of before."""
    if answer.prepared:
        return
    try:
        await answer.prepare(request)
        await answer.write_eof()
    except ConnectionError:
        pass  # the client left; aiohttp's own send of the answer finds that out too


def _proxy_handler(
    endpoint: str, config: Config
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler for one forwarded endpoint."""

    async def handle(request: web.Request) -> web.StreamResponse:
        app = request.app
        # A reload swaps the live config; this request keeps the one it read here.
        config = app[RELOADER].live.config
        ctx = RequestContext(request_id(request.headers.get("X-Request-Id")), endpoint)
        request[CONTEXT] = ctx
        timer = ctx.timer
        timer.begin("parse")
        check_content_type(request.headers.get("Content-Type"))
        body = await read_body(request, config.server.max_body_bytes, config.server.body_timeout_s)
        ctx.parsed = parse_body(endpoint, body, max_items=config.server.max_messages)
        # Alias -> version (sticky per user/key) -> its upstream model; 404 for unknown models.
        app[ROLLOUT].assign(ctx, request.headers)
        # Read in the same step as the routing table: a reload cannot split the two for a request.
        upstreams = app[POOLS].current
        timer.end("parse")
        for stage in app[STAGES]:
            answer = await stage(request, ctx)
            if answer is not None:
                return answer

        async def origin(tap: Tap | None) -> web.StreamResponse:
            candidates = app[ROLLOUT].regions(ctx, app[SELECTOR](ctx, upstreams))
            if not candidates:
                raise Unavailable(f"No region can serve model `{ctx.request.model}` now.")
            hooks: list[AttemptHook] = app[ATTEMPT_HOOKS]
            return await forward(
                request,
                ctx,
                candidates,
                config.timeouts,
                hooks,
                tap=tap,
                max_bytes=config.server.max_response_bytes,
            )

        # The cache wraps selection + forward: it may answer, or tee the origin's answer.
        around = app.get(AROUND)
        answer = await (around(request, ctx, origin) if around is not None else origin(None))
        await _send_whole(request, answer)
        return answer

    return handle


async def _models(request: web.Request) -> web.Response:
    # From the live config, so models added or removed by a reload show up at once.
    body = _models_body(request.app[RELOADER].live.config)
    return web.Response(body=body, content_type="application/json")


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    app = request.app
    if app[STATE].draining:
        return web.json_response({"status": "draining"}, status=503)
    if not all(check() for check in app[READY_CHECKS]):
        return web.json_response({"status": "not ready"}, status=503)
    return web.json_response({"status": "ready"})


_MODELS_BODY: web.AppKey[bytes] = web.AppKey("models_body")


async def _upstreams_ctx(app: web.Application) -> AsyncIterator[None]:
    """Region connection pools live exactly as long as the app; a reload swaps app[POOLS]."""
    pools = RegionPools(open_upstreams(app[CONFIG]))
    app[POOLS] = pools
    # The pools at startup; requests use app[POOLS].current, which a reload may replace.
    app[UPSTREAMS] = pools.current
    yield
    await pools.close()


def _install_rollout(
    app: web.Application, config: Config, config_path: Path | None, guard: Guard
) -> None:
    """Versions per request, canary outcomes, the version header, hot reload, rollout admin."""
    rollout = RolloutRuntime(config)
    app[ROLLOUT] = rollout
    app[ATTEMPT_HOOKS].append(canary_hook(rollout))
    app.on_response_prepare.append(tag_response(CONTEXT))
    reloader = Reloader(LiveConfig(config, config_path))
    reloader.register("rollout", rollout.prepare_reload, ("rollout", "models"))
    app[RELOADER] = reloader
    app.cleanup_ctx.append(sighup_ctx(reloader))

    async def adopt(app: web.Application) -> None:
        # At startup every feature has installed itself; reload the ones that can take it.
        health = app.get(HEALTH)
        if health is not None:
            reloader.register("health", health_preparer(health), ("health",))
        reloader.register("regions", regions_preparer(app[POOLS], health), ("regions",))

    app.on_startup.append(adopt)
    rollout_admin.add_routes(AdminRoutes(app.router, guard))


def build_app(config: Config, config_path: Path | None = None) -> web.Application:
    """The router application for `config`; pools open on startup and close on cleanup."""
    # client_max_size is a backstop; read_body enforces max_body_bytes with a proper 413.
    per_ip = InFlightPerIp(config.server.max_in_flight_per_ip)
    app = web.Application(
        middlewares=[_errors, per_ip.middleware()],
        client_max_size=config.server.max_body_bytes + 1,
    )
    app[CONFIG] = config
    app[SELECTOR] = config_order
    app[STAGES] = []
    app[ATTEMPT_HOOKS] = []
    app[READY_CHECKS] = []
    app[STATE] = RouterState()
    # Observability first: its middleware is outermost and its attempt hook sees every attempt.
    observability.install(
        app,
        config.observability,
        context_of=lambda request: request.get(CONTEXT),
        hooks=app[ATTEMPT_HOOKS],
        region_names=[region.name for region in config.regions],
        models=config.served_models(),
        cache_of=observability.cache_result if config.cache.enabled else observability.no_cache,
    )
    # One authenticator: the auth middleware's, whose admin check guards every admin route.
    auth = Authenticator.from_config(config.auth)
    _install_rollout(app, config, config_path, auth.check_admin)
    # Auth before the body is read, then per-key limits as the first stage after parsing.
    limits.install(app, config, auth, app[STAGES])
    # Nearest healthy region first; passive health, retry budget, x-router-region headers.
    app[SELECTOR] = routing.install(
        app,
        config,
        context_of=lambda request: request.get(CONTEXT),
        hooks=app[ATTEMPT_HOOKS],
        stages=app[STAGES],
        ready_checks=app[READY_CHECKS],
        guard=auth.check_admin,
    )
    if config.cache.enabled:
        app[AROUND] = cache_http.install(app, config, auth.check_admin)
    app[_MODELS_BODY] = _models_body(config)
    app.cleanup_ctx.append(_upstreams_ctx)
    for endpoint in (CHAT, COMPLETIONS, EMBEDDINGS):
        app.router.add_post(endpoint, _proxy_handler(endpoint, config))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app
