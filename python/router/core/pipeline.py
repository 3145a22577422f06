"""The driver: one proxied request's life, top to bottom (pingora's process_request).

read and validate -> authenticate -> version -> limit -> deadline -> cache -> select candidates
-> attempts (admit, send, first byte; failover, hedge) -> relay (continue mid-stream) -> settle
-> record. Each step is a stage Protocol (core.stages) that build_app filled in once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from aiohttp import web

from router.config import Config
from router.core.attempt import Attempts
from router.core.client_limit import InFlightPerIp
from router.core.context import RequestContext, request_id
from router.core.dialect import stored_ids
from router.core.failure import AttemptError
from router.core.open_streams import OpenStreams
from router.core.relay import relay_stream, whole
from router.core.request import (
    RESPONSES,
    ParsedRequest,
    check_content_type,
    parse_body,
    read_body,
)
from router.core.responses import error_response, failure_response
from router.core.stages import (
    AttemptObserver,
    Authenticator,
    Continuer,
    ExchangeObserver,
    FallbackPolicy,
    Hedger,
    RequestFilter,
    ResponseCache,
    ResponseDecorator,
    RetryPolicy,
    Selector,
    SlotGate,
    StateHomes,
    Tap,
    VersionRouter,
)
from router.core.stored import forward_stored
from router.core.timing import PARSE, STREAM, UPSTREAM
from router.core.upstream import CURRENT, Upstream, Upstreams
from router.errors import ApiError, NotFound, StateNotFound, Unavailable
from router.net.whole import send_whole

log = logging.getLogger("router")

# nginx's code for "the client closed the connection before the answer".
CLIENT_CLOSED = 499
CONTEXT: web.RequestKey[RequestContext] = web.RequestKey("router.context")


class LiveConfig(Protocol):
    """The config in force (a reload swaps it; a request reads it once)."""

    @property
    def config(self) -> Config: ...


class LivePools(Protocol):
    """The region pools in force (a reload may swap them)."""

    @property
    def current(self) -> Upstreams: ...


def _waits(ctx: RequestContext) -> bool:
    """Whether the client still waits (its deadline, if it gave one, has not passed)."""
    return ctx.deadline is None or time.monotonic() < ctx.deadline


def config_order(ctx: RequestContext, upstreams: Upstreams) -> Sequence[Upstream]:
    """Default selection: regions serving the model, by bias_ms then weight then config order."""
    return upstreams.serving(ctx.request.upstream_model)


class _Unlimited:
    """The retry policy without the routing feature: every candidate once, configured timeouts."""

    def begin(self, ctx: RequestContext, headers: object) -> None:
        return None

    def allow(self, ctx: RequestContext) -> bool:
        return True

    def first_byte(self, ctx: RequestContext, configured: float) -> float:
        return configured


@dataclass(slots=True)
class Features:
    """Every stage the driver calls, built once by build_app in dependency order."""

    auth: Authenticator | None = None
    rollout: VersionRouter | None = None
    filters: tuple[RequestFilter, ...] = ()
    retry: RetryPolicy = field(default_factory=_Unlimited)
    selector: Selector = config_order
    slots: SlotGate | None = None
    observers: tuple[AttemptObserver, ...] = ()
    streams: OpenStreams | None = None
    hedger: Hedger | None = None
    continuer: Continuer | None = None
    cache: ResponseCache | None = None
    fallbacks: FallbackPolicy | None = None
    decorators: tuple[ResponseDecorator, ...] = ()
    exchange: ExchangeObserver | None = None
    homes: StateHomes | None = None


class Pipeline:
    """Drives every proxied request through the features, one endpoint handler per path."""

    def __init__(
        self,
        features: Features,
        live: LiveConfig,
        pools: LivePools,
        per_ip: InFlightPerIp | None = None,
    ) -> None:
        self.features = features
        self.live = live
        self.pools = pools
        self.per_ip = per_ip if per_ip is not None and per_ip.limit > 0 else None
        # Proxied requests in flight: what a drain waits for, and ends at its deadline.
        self._active: dict[asyncio.Task[object], RequestContext] = {}
        # Set when the last of them ends, once a drain waits for that.
        self._quiet: asyncio.Event | None = None
        # The loop serving them, read once: asyncio.current_task() would find it with a
        # getpid() call per request (Python 3.11).
        self._loop: asyncio.AbstractEventLoop | None = None

    async def settle(self, within_s: float) -> int:
        """Wait up to `within_s` for the proxied requests in flight to end; how many are left."""
        if self._active:
            self._quiet = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within_s):
                    await self._quiet.wait()
        return len(self._active)

    def shut_down(self) -> int:
        """End every proxied request still in flight now (a drain's deadline): a stream with
        a failure event and a clean end, one not answered yet with a 503 to retry; how many."""
        for task, ctx in list(self._active.items()):
            ctx.shut_down = True
            task.cancel()
        return len(self._active)

    def handler(self, endpoint: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The aiohttp handler of one forwarded endpoint."""
        # A partial, not a wrapping coroutine: one frame less for every resumption.
        return partial(self.handle, endpoint=endpoint)

    async def handle(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        """One request, from its head to its access record."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        ctx = RequestContext(request_id(request.headers.get("X-Request-Id")), endpoint, loop)
        request[CONTEXT] = ctx
        token = CURRENT.set(ctx.timer)
        task = asyncio.current_task(loop)
        assert task is not None
        self._active[task] = ctx
        per_ip = self.per_ip
        ip: str | None = None
        status = 500
        answer: web.StreamResponse | None = None
        # Whether the answer may have used tokens (None: unknown, the client left).
        generated: bool | None = None
        try:
            try:
                if per_ip is not None:
                    per_ip.enter(request.remote or "-")
                    ip = request.remote or "-"
                answer = await self._serve(request, ctx)
                generated = True
            except Exception as exc:
                answer, generated = await _failed(request, ctx, exc)
            status = answer.status
            await _send_whole(request, answer)
            return answer
        except asyncio.CancelledError:
            ctx.timer.end_open()
            if not ctx.shut_down:
                status = CLIENT_CLOSED
                answer = None
                raise
            task.uncancel()
            answer = await _ended_by_shutdown(request, ctx)
            status = answer.status
            return answer
        finally:
            del self._active[task]
            if self._quiet is not None and not self._active:
                self._quiet.set()
            CURRENT.reset(token)
            if ip is not None and per_ip is not None:
                per_ip.leave(ip)
            self._finish(request, ctx, status, answer, generated)

    def _finish(
        self,
        request: web.Request,
        ctx: RequestContext,
        status: int,
        answer: web.StreamResponse | None,
        generated: bool | None,
    ) -> None:
        """Settle the token reservation and record the exchange, however it ended."""
        grant = ctx.grant
        if grant is not None:
            ctx.grant = None
            grant.settle(answer, generated)
        exchange = self.features.exchange
        if exchange is not None:
            exchange.finish(request, ctx, status, answer)

    async def _serve(self, request: web.Request, ctx: RequestContext) -> web.StreamResponse:
        features = self.features
        headers = request.headers
        if features.auth is not None:
            began = time.perf_counter_ns()
            ctx.tenant = features.auth.authenticate(headers)
            ctx.auth_ns = time.perf_counter_ns() - began
        # A reload swaps the live config; this request keeps the one it read here.
        config = self.live.config
        timer = ctx.timer
        timer.begin(PARSE)
        check_content_type(headers.get("Content-Type"))
        body = await read_body(request, config.server.max_body_bytes, config.server.body_timeout_s)
        ctx.parsed = asked = parse_body(ctx.endpoint, body, max_items=config.server.max_messages)
        # Alias -> version (sticky per user/key) -> its upstream model; 404 for unknown models.
        if features.rollout is not None:
            features.rollout.assign(ctx, headers)
        # Read in the same step as the routing table: a reload cannot split the two for a request.
        upstreams = self.pools.current
        model = ctx.request.upstream_model
        if not upstreams.serves(model, ctx.endpoint) and upstreams.serving(model):
            raise NotFound(
                f"No region serves model `{ctx.request.model}` on {ctx.endpoint}.",
                param="model",
                code="endpoint_not_served",
            )
        timer.end(PARSE)
        for stage in features.filters:
            await stage.admit(ctx, headers)
        features.retry.begin(ctx, headers)

        if features.cache is None:
            return await self._forward(request, ctx, config, upstreams, None, asked)

        async def origin(tap: Tap | None) -> web.StreamResponse:
            return await self._forward(request, ctx, config, upstreams, tap, asked)

        # The cache wraps selection + forward: it may answer, or tee the origin's answer.
        return await features.cache.serve(request, ctx, origin)

    async def _forward(
        self,
        request: web.Request,
        ctx: RequestContext,
        config: Config,
        upstreams: Upstreams,
        tap: Tap | None,
        asked: ParsedRequest,
    ) -> web.StreamResponse:
        """Select the candidates, attempt them in order, relay the answer; when no region
        could answer, the same for each fallback model in turn."""
        features = self.features
        fallbacks = features.fallbacks
        chain = fallbacks.chain(asked.model) if fallbacks is not None else ()
        if chain and ctx.tenant is not None:
            # A fallback is another model: only one the key may use itself.
            chain = tuple(model for model in chain if ctx.tenant.allows(model))
        timer = ctx.timer
        timer.begin(UPSTREAM)
        for step, model in enumerate((asked.model, *chain)):
            more = ctx.more_models = step < len(chain)
            if step:
                log.warning("request %s: falling back to model %s", ctx.request_id, model)
                ctx.model_base = ctx.attempts - ctx.spills
                ctx.parsed = asked.as_model(model)
                ctx.fallback = model
                if features.rollout is not None:
                    features.rollout.assign(ctx, request.headers)
            candidates = upstreams.on(ctx.endpoint, features.selector(ctx, upstreams))
            if features.rollout is not None:
                candidates = features.rollout.regions(ctx, candidates)
            # Responses API state: the region that made a response is noted, and holds it.
            homes = features.homes if asked.stateful else None
            owner = ""
            if homes is not None:
                owner = ctx.owner
                if asked.state_ref is not None or asked.state_items:
                    candidates = await _pinned(homes, asked, owner, upstreams, candidates)
            if not candidates:
                if more and fallbacks is not None and fallbacks.moves(None) and _waits(ctx):
                    continue
                timer.end(UPSTREAM)
                raise Unavailable(f"No region can serve model `{ctx.request.model}` now.")
            attempts = Attempts(
                ctx,
                request.headers,
                candidates,
                config.timeouts,
                retry=features.retry,
                observers=features.observers,
                slots=features.slots,
                hedger=features.hedger,
                max_bytes=config.server.max_response_bytes,
                max_retry_after_s=config.routing.max_retry_after_s,
            )
            try:
                try:
                    opened = await attempts.first()
                except AttemptError as exc:
                    if more and fallbacks is not None and fallbacks.moves(exc) and _waits(ctx):
                        continue
                    timer.end(UPSTREAM)
                    answer = failure_response(exc, ctx.request_id, anthropic=ctx.dialect.anthropic)
                    if tap is not None:
                        tap.refused(answer)  # identical requests coalesced behind it get it too
                    return answer
                timer.end(UPSTREAM)
                region = opened.upstream.name
                if opened.response is None:
                    if homes is not None and opened.status == 200:
                        for made in stored_ids(opened.body or b""):
                            homes.record(made, region, owner)
                    return whole(ctx, opened, tap)
                timer.begin(STREAM)
                try:
                    return await relay_stream(
                        request,
                        ctx,
                        opened,
                        config.timeouts.idle,
                        tap=tap,
                        max_bytes=config.server.max_response_bytes,
                        max_event_bytes=config.server.max_event_bytes,
                        continuer=features.continuer,
                        attempts=attempts,
                        strip_usage=opened.usage_added,
                        on_id=None
                        if homes is None
                        else partial(homes.record, region=region, owner=owner),
                        broke=None if features.streams is None else features.streams.broke,
                    )
                finally:
                    timer.end(STREAM)
            finally:
                attempts.release()
                if features.streams is not None:
                    # After the relay: a stream's success is known only once it ended.
                    features.streams.ended(ctx)
        raise AssertionError("unreachable: the last model returns or raises")

    async def unknown(
        self, request: web.Request, error: ApiError, anthropic: bool = False
    ) -> web.StreamResponse:
        """A /v1/ request the router does not serve (an unknown path, or a method its path does
        not take): authenticated, then `error` (its 404, or 405 with Allow)."""
        ctx = RequestContext(request_id(request.headers.get("X-Request-Id")), request.path)
        request[CONTEXT] = ctx
        if self.features.auth is not None:
            try:
                self.features.auth.authenticate(request.headers)
            except ApiError as exc:
                error = exc
        answer = error_response(error, ctx.request_id, anthropic=anthropic)
        try:
            await _send_whole(request, answer)
        finally:
            self._finish(request, ctx, answer.status, answer, False)
        return answer

    async def stored(self, request: web.Request) -> web.StreamResponse:
        """A stored Responses API response asked for again (core.stored): authenticated, then
        relayed from the region holding it."""
        ctx = RequestContext(request_id(request.headers.get("X-Request-Id")), RESPONSES)
        request[CONTEXT] = ctx
        status = 500
        answer: web.StreamResponse | None = None
        try:
            try:
                if self.features.auth is not None:
                    ctx.tenant = self.features.auth.authenticate(request.headers)
                if self.features.homes is None:
                    raise NotFound(f"Unknown path {request.path}.")
                answer = await forward_stored(
                    request, ctx, self.features.homes, self.pools.current, self.live.config
                )
            except Exception as exc:
                answer, _ = await _failed(request, ctx, exc)
            status = answer.status
            await _send_whole(request, answer)
            return answer
        except asyncio.CancelledError:
            status, answer = CLIENT_CLOSED, None
            raise
        finally:
            self._finish(request, ctx, status, answer, False)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """on_response_prepare: `Cache-Control: no-store` and every feature's headers on every
        answer of a proxied request (streams, relayed errors, cache hits), in one place."""
        ctx = request.get(CONTEXT)
        if ctx is None:
            return
        ctx.answer = response
        features = self.features
        if features.exchange is not None:
            features.exchange.stamp(ctx, response)
        headers = response.headers
        # An answer is the tenant's alone (a cache hit included): no shared cache in front of
        # the router may keep it for another. A region's own caching headers never reach here.
        headers["Cache-Control"] = "no-store"
        for decorator in features.decorators:
            decorator(ctx, headers)


async def _pinned(
    homes: StateHomes,
    asked: ParsedRequest,
    owner: str,
    upstreams: Upstreams,
    candidates: Sequence[Upstream],
) -> Sequence[Upstream]:
    """The one region holding the state a request refers to, healthy or not (no other has
    it): its previous response's, else that of the first item it refers to that `owner` made
    here; the usual candidates when this router saw none of it made. Another tenant's response
    or item is not found."""
    home = None
    param = "previous_response_id"
    ref = asked.state_ref
    if ref is not None:
        home = await homes.home(ref, owner)
    if asked.state_items:
        # Every item is checked for its tenant (those not in memory in one Redis round trip).
        try:
            held_by = await homes.homes(asked.state_items, owner)
        except StateNotFound as exc:
            # Worded as for an unknown id: another tenant's item does not exist for this one.
            raise StateNotFound(exc.ref, "Item", "item_not_found", param="input") from None
        for item, held in zip(asked.state_items, held_by, strict=True):
            if home is None and held is not None:
                ref, home, param = item, held, "input"
    if home is None:
        return candidates
    upstream = upstreams.get(home)
    if upstream is None:
        what = "Response" if param == "previous_response_id" else "Item"
        raise NotFound(
            f"{what} `{ref}` is held by region `{home}`, which is no longer configured.",
            param=param,
        )
    return [upstream]


async def _failed(
    request: web.Request, ctx: RequestContext, exc: Exception
) -> tuple[web.StreamResponse, bool | None]:
    """The answer to a request whose serving raised `exc`, and whether it may have used tokens.

    Before any response began: the error in the API's shape (a refusal generated nothing).
    After one began (a stream, a cache hit's replay): that response, ended as a failure. A
    second response would land inside the first one's body, so none is ever made: a stream
    gets one error event in the API's shape and a clean end, any other body a closed
    connection (the client sees it cut short); a client that left is let go.
    """
    # The stage it failed in ends here: its time shows in Server-Timing and the access record.
    ctx.timer.end_open()
    started = ctx.answer
    anthropic = ctx.dialect.anthropic
    if started is None:
        if isinstance(exc, ApiError):
            return error_response(exc, ctx.request_id, anthropic=anthropic), False
        log.exception("unhandled error on %s %r", request.method, request.path)
        return error_response(
            ApiError("Internal router error."), ctx.request_id, anthropic=anthropic
        ), None
    if isinstance(exc, ConnectionError):
        return started, None
    if isinstance(exc, ApiError):
        message = exc.message
        log.warning("request %s: failed after its response began: %s", ctx.request_id, message)
    else:
        message = "The router failed mid-stream."
        log.exception("request %s: failed after its response began", ctx.request_id)
    await _end_begun(request, ctx, started, message)
    return started, None


async def _end_begun(
    request: web.Request,
    ctx: RequestContext,
    started: web.StreamResponse,
    message: str,
    code: str = "upstream_stream_error",
) -> None:
    """End an answer whose head went out as a failure: a stream with one error event in its
    API's shape and a clean end, any other body by closing the connection (cut short)."""
    if started.content_type == "text/event-stream" and not started._eof_sent:
        with contextlib.suppress(ConnectionError):
            await started.write(ctx.stream_failure(message, ctx.dialect.tracker(), code))
            await started.write_eof()
    elif request.transport is not None:
        request.transport.close()


async def _ended_by_shutdown(request: web.Request, ctx: RequestContext) -> web.StreamResponse:
    """What a request in flight at a drain's deadline gets: a stream already begun its failure
    event and a clean end, one not answered yet a 503 the SDKs retry; the connection closes."""
    message = "The router is shutting down; retry the request."
    started = ctx.answer
    if started is None:
        error = Unavailable(message, code="shutting_down", headers={"Retry-After": "1"}, close=True)
        answer = error_response(error, ctx.request_id, anthropic=ctx.dialect.anthropic)
        await _send_whole(request, answer)
        return answer
    started.force_close()
    await _end_begun(request, ctx, started, message, "shutting_down")
    return started


async def _send_whole(request: web.Request, answer: web.StreamResponse) -> None:
    """Send a whole answer now, so the bookkeeping after it (usage, limits, metrics, access
    log) runs once the client has it instead of before."""
    if answer.prepared:
        return
    try:
        if isinstance(answer, web.Response):
            await send_whole(request, answer)
        else:
            await answer.prepare(request)
            await answer.write_eof()
    except ConnectionError:
        pass  # the client left; aiohttp's own send of the answer finds that out too
