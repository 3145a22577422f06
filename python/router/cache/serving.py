"""The cache on the request path: lookup, replay (body or SSE), miss tee, coalesced followers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from typing import Any

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from router import native
from router.access.auth import ANONYMOUS_TENANT
from router.cache.admin import CACHE, MODELS, NAMESPACES, add_routes, namespaces_of
from router.cache.coalescing import Flight, FlightFailed
from router.cache.policy import (
    Decision,
    Entry,
    KeyFn,
    Level,
    Rule,
    StreamRecorder,
    XCache,
    complete_body,
    decide,
    parse_cache_control,
)
from router.cache.tiers import ResponseCache, open_cache
from router.config import AuthConfig, Config
from router.core.admin import AdminRoutes, Guard
from router.core.context import RequestContext
from router.core.request import EMBEDDINGS, RESPONSES
from router.core.stages import Origin
from router.core.stream import EventState, StreamState
from router.core.timing import CACHE as CACHE_STAGE
from router.core.upstream import REQUEST_DROP
from router.errors import UpstreamError
from router.native import NativeError
from router.net import sse
from router.net.stream_response import StreamResponse

log = logging.getLogger("router")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
# How often a follower whose leader failed before sending anything rejoins (or leads) a flight.
FOLLOW_RETRIES = 2


class Mark(msgspec.Struct):
    """The cache outcome of one request, rendered as `x-cache` and `Age` response headers."""

    outcome: XCache
    age: int | None = None
    # When the answer's headers went out (perf_counter; 0: not yet): from then on a late
    # shared-tier hit is ignored.
    committed: float = 0.0


def cache_headers(ctx: RequestContext, headers: MutableMapping[str, str]) -> None:
    """A response decorator: `x-cache` (and `Age` on hits) on whatever answers the request."""
    mark = ctx.cache
    if mark is not None:
        if isinstance(mark, Mark) and not mark.committed:
            mark.committed = time.perf_counter()
        headers["x-cache"] = mark.outcome
        if mark.age is not None:
            headers["Age"] = str(mark.age)


class _Knobs(msgspec.Struct):
    """The body fields the cache reads (everything else is skipped by the decoder)."""

    temperature: Any = None
    n: Any = None
    tools: Any = None
    functions: Any = None
    # Tools by other names: Anthropic's MCP connector, OpenAI's web search on chat.
    mcp_servers: Any = None
    web_search_options: Any = None
    # llama.cpp's server's own: a dynamic temperature range, its sampler chain, its XTC
    # sampler, and its `n` (cache.policy).
    dynatemp_range: Any = None
    samplers: Any = None
    xtc_probability: Any = None
    xtc_threshold: Any = None
    n_cmpl: Any = None
    # Transport fields, left out of the fingerprint, that an answer still shows (_ECHOED).
    metadata: Any = None
    user: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    stream_options: Any = None


_KNOBS = msgspec.json.Decoder(_Knobs)
_UNREADABLE = _Knobs(temperature="unreadable")
# What a Responses object echoes of its request's transport fields; every other API's answer
# shows only the service tier it ran on. `store` is left out: only `store: false` Responses
# requests are cached at all (core.request: any other is stateful).
_ECHOED = ("metadata", "user", "service_tier", "prompt_cache_key", "safety_identifier")
_TIER = ("service_tier",)


def fields_of(body: bytes) -> _Knobs:
    """The fields the cache reads of a request body (the body is already validated JSON)."""
    try:
        return _KNOBS.decode(body)
    except (msgspec.MsgspecError, RecursionError):
        return _UNREADABLE


def _policy(k: _Knobs) -> dict[str, Any]:
    return {
        "temperature": k.temperature,
        "n": k.n,
        "tools": k.tools,
        "functions": k.functions,
        "mcp_servers": k.mcp_servers,
        "web_search_options": k.web_search_options,
        "dynatemp_range": k.dynatemp_range,
        "samplers": k.samplers,
        "xtc_probability": k.xtc_probability,
        "xtc_threshold": k.xtc_threshold,
        "n_cmpl": k.n_cmpl,
    }


def knobs(body: bytes) -> dict[str, Any]:
    """The policy-relevant request fields as a mapping (the body is already validated JSON)."""
    return _policy(fields_of(body))


def answer_shape(
    k: _Knobs,
    endpoint: str,
    stream: bool,
    headers: tuple[tuple[str, str], ...],
    version: tuple[str, tuple[str, ...]] | None = None,
) -> bytes:
    """What shapes the answer besides the fingerprint, for the key (b"": nothing does): the
    forwarded headers, the transport fields the answer echoes, a stream's options beyond
    include_usage (vLLM's continuous_usage_stats puts usage in every chunk), and the model
    version the request was given with the regions it runs in (`version`: two versions may
    call the same upstream model, in different regions)."""
    names = _ECHOED if endpoint == RESPONSES else _TIER
    fields: list[tuple[str, Any]] = [(n, v) for n in names if (v := getattr(k, n)) is not None]
    if version is not None:
        fields.append(("version", version))
    options = k.stream_options
    if stream and isinstance(options, dict) and options.keys() - {"include_usage"}:
        rest = {n: v for n, v in options.items() if n != "include_usage"}
        fields.append(("stream_options", rest))
    if not fields and not headers:
        return b""
    return msgspec.json.encode((headers, fields), order="sorted")


class Tap:
    """Given to the origin (proxy.forward): sees what it sends the client on a cache miss."""

    __slots__ = (
        "_cache",
        "_flight",
        "_key",
        "_namespace",
        "_recorded",
        "_recorder",
        "_rule",
        "_store",
        "ctx",
    )

    def __init__(
        self,
        cache: ResponseCache,
        ctx: RequestContext,
        key: bytes,
        namespace: str,
        rule: Rule,
        *,
        store: bool,
        flight: Flight[Entry] | None,
    ) -> None:
        self._cache = cache
        self.ctx = ctx
        self._namespace = namespace
        self._key = key
        self._rule = rule
        self._store = store
        self._flight = flight
        self._recorder = StreamRecorder(typed=ctx.dialect.events)
        self._recorded = 0

    def chunk(self, data: bytes) -> None:
        """Stream bytes just forwarded to the client (once detached: read for followers)."""
        self._recorded += len(data)
        if self._recorded > self._max_entry and not self.wanted():
            # Too big to store and nobody follows: stop buffering it, and let no one join it
            # from here on (a late joiner would need it all kept from its start).
            if self._flight is not None:
                self._cache.flights.fail(self._flight)
                self._flight = None
            self._store = False
            self._recorder.chunks.clear()
            return
        events = self._recorder.feed(data)
        if self._flight is not None:
            for event in events:
                self._flight.publish(event)

    def wanted(self) -> bool:
        """Whether coalesced followers read this exchange (it outlives its own client then)."""
        return self._flight is not None and self._flight.followers > 0

    def detach(self) -> None:
        """The exchange goes on without its leader's client; its end settles the flight."""
        if self._flight is not None:
            self._flight.detached = True

    def end(self, clean: bool, *, storable: bool = True) -> None:
        """The stream ended: `clean` when the client got a whole answer; `storable` unless it
        is two regions' answer (a continued stream): shared with followers, never stored."""
        if not clean:
            self._recorder.fail()
        last = self._recorder.close()
        if self._flight is not None:
            for event in last:
                self._flight.publish(event)
        entry = self._entry(chunks=tuple(self._recorder.chunks), stream=True)
        # A fallback model's answer is not the answer to the model asked for: never stored.
        store = storable and self._store and self.ctx.fallback is None
        if store and self._recorder.complete and self._recorded <= self._max_entry:
            self._cache.put(self._key, entry)
        if self._flight is not None:
            if clean:
                self._cache.flights.finish(self._flight, entry)
            else:
                self._cache.flights.fail(self._flight)

    def body(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """A whole non-stream answer just relayed to the client."""
        # A region's final non-200 answer (a 4xx the attempt loop does not retry) is what any
        # identical request would get: followers share it, headers included, but it is never
        # stored. It is a whole body even when a stream was asked for, and followers get it so.
        entry = self._entry(
            body=body, content_type=headers.get("Content-Type") or "application/json"
        )
        if status != 200:
            entry = msgspec.structs.replace(entry, status=status, headers=_kept(headers))
        elif (
            self._store
            and self.ctx.fallback is None
            and len(body) <= self._max_entry
            and complete_body(body)
        ):
            self._cache.put(self._key, entry)
        if self._flight is not None:
            self._cache.flights.finish(self._flight, entry)

    def refused(self, answer: web.Response) -> None:
        """The answer when no region gave one (the last region's refusal, say a 429 with
        Retry-After, or the router's 502/504), or the router's own instead of a region's 4xx
        that was no API error: followers get it too, headers included, instead of each asking
        the region again. Never stored."""
        if self._flight is None:
            return
        body = answer.body
        headers = answer.headers
        entry = self._entry(
            body=body if isinstance(body, bytes) else b"",
            content_type=headers.get("Content-Type", "application/json"),
        )
        entry = msgspec.structs.replace(entry, status=answer.status, headers=_kept(headers))
        self._cache.flights.finish(self._flight, entry)

    @property
    def _max_entry(self) -> int:
        return self._cache.config.max_entry_bytes

    def _entry(
        self,
        *,
        body: bytes = b"",
        chunks: tuple[bytes, ...] = (),
        content_type: str = "text/event-stream",
        stream: bool = False,
    ) -> Entry:
        return self._cache.new_entry(
            namespace=self._namespace,
            model=self.ctx.request.upstream_model,
            rule=self._rule,
            content_type=content_type,
            body=body,
            chunks=chunks,
            stream=stream,
        )


# A shared answer's headers each follower gets its own of (or that the entry holds apart).
_OWN_HEADERS = frozenset({"content-length", "content-type", "x-request-id"})


def _kept(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The headers of an answer followers share, but for the ones each gets its own of."""
    return tuple((k, v) for k, v in headers.items() if k.lower() not in _OWN_HEADERS)


async def serve(
    request: web.Request,
    ctx: RequestContext,
    cache: ResponseCache,
    namespace: str,
    origin: Origin,
) -> web.StreamResponse:
    """Answer from the cache, or from `origin` (region selection + forward) teed into it."""
    parsed = ctx.request
    if parsed.stateful:
        # State only its region holds (a stored response, a chain): never shared or replayed.
        return await _origin(request, ctx, cache, XCache.BYPASS, origin, None)
    rule = cache.rule(parsed.model)
    fields = fields_of(parsed.body)
    decision: Decision = decide(
        _policy(fields),
        rule,
        parse_cache_control(request.headers.get("Cache-Control")),
        sampled=parsed.endpoint != EMBEDDINGS,
    )
    if decision.bypass:
        return await _origin(request, ctx, cache, XCache.BYPASS, origin, None)
    # A header or an echoed field can change the answer: no client may get another's.
    shape = answer_shape(
        fields,
        parsed.endpoint,
        parsed.stream,
        _forwarded(request.headers),
        None if ctx.assignment is None else ctx.assignment.distinct,
    )
    try:
        key = cache.key(
            parsed.body,
            namespace=namespace,
            level=rule.level,
            endpoint=parsed.endpoint,
            stream=parsed.stream,
            usage=parsed.include_usage,
            shape=shape,
        )
    except NativeError as exc:
        # The router already validated the body; a shape the fingerprint refuses is just uncached.
        log.debug("request %s: not cached, no fingerprint: %s", ctx.request_id, exc)
        return await _origin(request, ctx, cache, XCache.BYPASS, origin, None)
    if not decision.lookup:
        # no-cache: the client wants a fresh answer, so it neither reads nor joins a flight.
        tap = Tap(cache, ctx, key, namespace, rule, store=decision.store, flight=None)
        return await _origin(request, ctx, cache, XCache.BYPASS, origin, tap)
    entry = cache.memory.get(key, namespace)
    if entry is None and cache.shared_first():
        # Tier 2 is measured to be much nearer than any region: asking it first costs little
        # (at most shared_lookup_first_ms).
        entry = await cache.shared_first_lookup(key, namespace, parsed.upstream_model)
        if entry is None:
            entry = cache.memory.get(key, namespace)
    elif entry is None:
        return await _lead_or_follow(request, ctx, cache, key, namespace, rule, decision, origin)
    if entry is not None:
        return await _replay(request, ctx, cache, entry)
    return await _lead_or_follow(
        request, ctx, cache, key, namespace, rule, decision, origin, shared=False
    )


async def _lead_or_follow(
    request: web.Request,
    ctx: RequestContext,
    cache: ResponseCache,
    key: bytes,
    namespace: str,
    rule: Rule,
    decision: Decision,
    origin: Origin,
    *,
    shared: bool = True,
) -> web.StreamResponse:
    """A miss in what was asked so far: lead the upstream call (racing tier 2 when `shared`
    and there is one) or follow the identical request already leading it."""
    # Entries are the upstream model's (the key is the body the region gets).
    model = ctx.request.upstream_model
    race = shared and cache.shared_may_win(model)
    if not cache.config.coalesce:
        tap = Tap(cache, ctx, key, namespace, rule, store=decision.store, flight=None)
        if race:
            return await _race(request, ctx, cache, origin, tap, (key, namespace, model), None)
        return await _origin(request, ctx, cache, XCache.MISS, origin, tap)
    # The key holds the forwarded headers: only requests whose headers match share one
    # upstream exchange (a header can change the answer, or the error).
    for _ in range(FOLLOW_RETRIES + 1):
        flight, leads = cache.flights.join(key)
        if leads:
            with cache.flights.lead(flight):
                # A flight that ended while this request awaited tier 2 may have just stored it.
                entry = cache.memory.get(key, namespace)
                if entry is not None:
                    cache.flights.finish(flight, entry)
                    return await _replay(request, ctx, cache, entry)
                tap = Tap(cache, ctx, key, namespace, rule, store=decision.store, flight=flight)
                if race:
                    where = (key, namespace, model)
                    return await _race(request, ctx, cache, origin, tap, where, flight)
                return await _origin(request, ctx, cache, XCache.MISS, origin, tap)
        try:
            return await _follow(request, ctx, cache, flight)
        except _Rejoin:
            continue
    # Leader after leader failed to get any answer: going upstream one by one now would be a
    # thundering herd on a region that is already failing.
    ctx.timer.end(CACHE_STAGE)
    cache.count(XCache.MISS)
    ctx.cache = Mark(XCache.MISS)
    raise UpstreamError(
        "The region failed to answer this request (shared with identical concurrent requests).",
        code="upstream_error",
    )


async def _origin(
    request: web.Request,
    ctx: RequestContext,
    cache: ResponseCache,
    outcome: XCache,
    origin: Origin,
    tap: Tap | None,
) -> web.StreamResponse:
    ctx.timer.end(CACHE_STAGE)
    cache.count(outcome)
    mark = ctx.cache = Mark(outcome)
    if outcome is not XCache.MISS:
        return await origin(tap)
    began = time.perf_counter()
    answer = await origin(tap)
    cache.answered(ctx.request.upstream_model, (mark.committed or time.perf_counter()) - began)
    return answer


def _lookup(
    cache: ResponseCache, key: bytes, namespace: str, model: str
) -> asyncio.Task[Entry | None]:
    task = asyncio.get_running_loop().create_task(cache.shared(key, namespace, model))
    # Ignored when the region wins; RedisTier.get swallows Redis failures itself.
    task.add_done_callback(_consume)
    return task


def _consume(task: asyncio.Task[Entry | None]) -> None:
    if not task.cancelled():
        task.exception()


async def _race(
    request: web.Request,
    ctx: RequestContext,
    cache: ResponseCache,
    origin: Origin,
    tap: Tap,
    where: tuple[bytes, str, str],
    flight: Flight[Entry] | None,
) -> web.StreamResponse:
    """The region request and the tier-2 lookup at once: a tier-2 hit that comes before the
    region's answer has started replaces it (the region request is cancelled); otherwise the
    region's answer is served and the lookup ignored. A miss waits for nothing but the region."""
    ctx.timer.end(CACHE_STAGE)
    mark = ctx.cache = Mark(XCache.MISS)
    began = time.perf_counter()
    answer = asyncio.ensure_future(origin(tap))
    # Created second, so it runs second: the region request goes out before the lookup's work.
    lookup = _lookup(cache, *where)
    try:
        await asyncio.wait((answer, lookup), return_when=asyncio.FIRST_COMPLETED)
        if not answer.done() and not mark.committed:
            entry = lookup.result()
            if entry is not None:
                answer.cancel()
                await asyncio.wait((answer,))
                if answer.cancelled():
                    if flight is not None:
                        cache.flights.finish(flight, entry)
                    return await _replay(request, ctx, cache, entry)
        cache.count(XCache.MISS)
        response = await answer
        cache.answered(ctx.request.upstream_model, (mark.committed or time.perf_counter()) - began)
        return response
    except asyncio.CancelledError:
        answer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await answer
        raise


async def _replay(
    request: web.Request, ctx: RequestContext, cache: ResponseCache, entry: Entry
) -> web.StreamResponse:
    """A hit: the stored body, or the stored SSE events as the live relay sent them."""
    ctx.timer.end(CACHE_STAGE)
    cache.count(XCache.HIT)
    ctx.cache = Mark(XCache.HIT, entry.age(cache.clock()))
    if not entry.stream:
        headers = {"Content-Type": entry.content_type, "X-Request-Id": ctx.request_id}
        if entry.headers:  # a coalesced leader's refusal: its Retry-After and the like too
            return web.Response(
                status=entry.status,
                body=entry.body,
                headers=CIMultiDict([*entry.headers, *headers.items()]),
            )
        return web.Response(status=entry.status, body=entry.body, headers=headers)
    resp = StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": ctx.request_id})
    await resp.prepare(request)
    data = b"".join(entry.chunks)
    if ctx.meter is not None:
        ctx.meter.feed(data)  # settled as a live stream is: its usage event, else its text
    # Headers, events and the chunked terminator in one write.
    await resp.write_eof(data)
    return resp


# Headers that never change an answer: the ones no region ever gets (core.upstream drops them:
# hop-by-hop, credentials, forwarding), and transport, SDK telemetry, tracing and correlation
# ones (W3C, B3/Zipkin, Jaeger, Datadog, Sentry, AWS, Google Cloud), and what proxies and CDNs
# in front of the router add per request.
_VOLATILE = REQUEST_DROP | {
    "accept",
    "b3",
    "baggage",
    "cache-control",
    "cdn-loop",
    "content-type",
    "grpc-trace-bin",
    "sentry-trace",
    "traceparent",
    "tracestate",
    "true-client-ip",
    "uber-trace-id",
    "user-agent",
    "via",
    "x-client-ip",
    "x-amzn-trace-id",
    "x-cloud-trace-context",
    "x-cluster-client-ip",
    "x-correlation-id",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-ot-span-context",
    "x-original-forwarded-for",
    "x-router-timeout-ms",
}
# ... and every header under these prefixes.
_VOLATILE_PREFIXES = (
    "cf-",
    "ot-baggage-",
    "uberctx-",
    "x-amz-cf-",
    "x-b3-",
    "x-datadog-",
    "x-envoy-",
    "x-stainless-",
)


# Header name as sent -> its lower case if it may shape an answer, else "" (every request
# reads it: a dict lookup per header costs a third of lower-casing and testing each).
_SHAPING: dict[str, str] = {}


def _shaping(name: str) -> str:
    low = name.lower()
    shaping = "" if low in _VOLATILE or low.startswith(_VOLATILE_PREFIXES) else low
    # Names come from clients: only short ones are noted, and at most 4096 of them.
    if len(name) <= 64:
        if len(_SHAPING) >= 4096:
            _SHAPING.clear()
        _SHAPING[name] = shaping
    return shaping


def _forwarded(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The request's headers that could change a region's answer, in a stable order."""
    out = []
    names = _SHAPING
    for name, value in headers.items():
        low = names.get(name)
        if low is None:
            low = _shaping(name)
        if low:
            out.append((low, value))
    if not out:
        return ()
    out.sort()
    return tuple(out)


class _Rejoin(Exception):
    """The leader failed before this follower sent anything: try again."""


async def _follow(
    request: web.Request, ctx: RequestContext, cache: ResponseCache, flight: Flight[Entry]
) -> web.StreamResponse:
    """Serve a coalesced request from its leader's flight (counted as a hit: no origin call);
    however it ends, it no longer reads the flight."""
    try:
        if not ctx.request.stream:
            try:
                entry = await flight.result()
            except FlightFailed:
                raise _Rejoin from None
            return await _replay(request, ctx, cache, entry)
        resp: web.StreamResponse | None = None
        # The events its leader's client got, byte for byte; a [DONE] waits for the flight to
        # end cleanly (a stream that breaks after it never looks complete to a follower).
        done = b""
        try:
            async for event in flight.follow():
                if resp is None:
                    ctx.timer.end(CACHE_STAGE)
                    cache.count(XCache.HIT)
                    ctx.cache = Mark(XCache.HIT, 0)
                    headers = {**SSE_HEADERS, "X-Request-Id": ctx.request_id}
                    resp = StreamResponse(headers=headers)
                    await resp.prepare(request)
                if done or (sse.DONE in event and sse.data_of(event) == sse.DONE):
                    done += event
                    continue
                if ctx.meter is not None:
                    ctx.meter.feed(event)
                await resp.write(event)
        except FlightFailed as exc:
            if resp is None:
                raise _Rejoin from None
            log.warning("request %s: coalesced stream broke: %r", ctx.request_id, exc.cause)
            state = _relayed(ctx, flight.chunks[: exc.sent])
            await resp.write(ctx.stream_failure("The region stopped mid-stream.", state))
            await resp.write_eof()
            return resp
        if resp is None:  # no stream came: the leader's whole answer (a region's 4xx, say)
            return await _replay(request, ctx, cache, await flight.result())
        if ctx.meter is not None and done:
            ctx.meter.feed(done)
        await resp.write_eof(done)
        return resp
    finally:
        flight.leave()


def _relayed(ctx: RequestContext, sent: list[bytes]) -> StreamState | EventState:
    """The API's stream state after the whole events a follower relayed, for the failure event
    that ends its stream (a Responses stream's id and numbering)."""
    state = ctx.dialect.tracker()
    for event in sent:
        payload = sse.data_of(event)
        if payload is not None:
            state.note(payload)
    return state


NamespaceOf = Callable[[RequestContext], str | None]


def tenant_namespace(auth: AuthConfig) -> NamespaceOf:
    """The request's cache namespace: its tenant's; with auth off, the anonymous one."""
    enabled: bool | None = auth.enabled
    # Unset means on as soon as any key is configured (the auth feature's rule).
    auth_enabled = bool(auth.keys) if enabled is None else enabled

    def namespace_of(ctx: RequestContext) -> str | None:
        tenant = ctx.tenant
        if tenant is not None:
            return tenant.cache_namespace
        # With auth on, an unknown tenant must never share a namespace with anyone: no caching.
        return None if auth_enabled else ANONYMOUS_TENANT.cache_namespace

    return namespace_of


def native_key_fn() -> KeyFn:
    """The Rust fingerprint as a KeyFn."""

    def key(body: bytes, namespace: str, level: Level) -> bytes:
        return native.fingerprint(body, namespace=namespace, level=level)

    return key


class CacheLayer:
    """The response cache on the request path (core.stages.ResponseCache); opened with the app."""

    def __init__(self, config: Config, key_fn: KeyFn | None = None) -> None:
        self.config = config.cache
        self.key_fn = key_fn or native_key_fn()
        self.namespace_of = tenant_namespace(config.auth)
        self.namespaces = namespaces_of(config.auth)
        self.cache: ResponseCache | None = None

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """A cleanup_ctx: the tiers (and their Redis client) live as long as the app."""
        cache = open_cache(self.config, self.key_fn)
        self.cache = cache
        app[CACHE] = cache
        yield
        await cache.close()

    def add_routes(
        self, app: web.Application, guard: Guard, models: Callable[[str], frozenset[str]]
    ) -> None:
        """GET /admin/cache/stats and POST /admin/cache/purge behind the admin check
        (`models`: the upstream models a client-facing name stands for now)."""
        app[NAMESPACES] = self.namespaces
        app[MODELS] = models
        add_routes(AdminRoutes(app.router, guard))

    async def serve(
        self, request: web.Request, ctx: RequestContext, origin: Origin
    ) -> web.StreamResponse:
        """Answer from the cache, or from the origin teed into it."""
        cache = self.cache
        assert cache is not None, "the cache opens with the app"
        namespace = self.namespace_of(ctx)
        if namespace is None:
            return await _origin(request, ctx, cache, XCache.BYPASS, origin, None)
        # Ends when the answer starts: a hit's lookup, a miss's lookup, a follower's wait.
        ctx.timer.begin(CACHE_STAGE)
        return await serve(request, ctx, cache, namespace, origin)
