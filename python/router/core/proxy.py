"""Forwarding one request to a region: the attempt loop, then relaying the body or SSE stream."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from router.access.auth import TENANT
from router.access.limits import METER
from router.config import TimeoutsConfig
from router.core.context import RequestContext
from router.core.upstream import Upstream, response_headers
from router.errors import ApiError, UpstreamError
from router.net import http1
from router.net.idle import IdleWatch
from router.net.stream_response import StreamResponse
from router.observability.timing import QUEUE
from router.routing.admission import ADMISSION, Slot, Spill

log = logging.getLogger("router")

# Statuses that mean "this region cannot take it now, another may": retried before the first byte.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A region's answer body above this is a failure of the region ([server] max_response_bytes).
DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
# What an SSE stream's first bytes may start with (a field name, or a comment).
_SSE_STARTS = (b"data:", b":", b"event:", b"id:", b"retry:")
_RAW = msgspec.json.Decoder(msgspec.Raw)


class Opened:
    """An attempt that got a usable answer: a whole body, or a stream and its first chunk."""

    __slots__ = ("body", "first", "headers", "response", "status", "upstream")

    def __init__(
        self,
        upstream: Upstream,
        status: int,
        headers: CIMultiDict[str],
        *,
        body: bytes | None = None,
        response: http1.Response | None = None,
        first: bytes = b"",
    ) -> None:
        self.upstream = upstream
        self.status = status
        self.headers = headers
        # Non-stream (or any non-200 answer): the whole body, byte-exact.
        self.body = body
        # Stream: the live upstream response, its first chunk already read.
        self.response = response
        self.first = first


class AttemptError(Exception):
    """One attempt at one region failed before anything reached the client."""

    def __init__(
        self,
        region: str,
        kind: str,
        detail: str,
        *,
        retryable: bool = True,
        status: int | None = None,
        headers: CIMultiDict[str] | None = None,
        body: bytes = b"",
    ) -> None:
        super().__init__(f"{region}: {kind}: {detail}")
        self.region = region
        # "connect" | "timeout" | "disconnect" | "status"
        self.kind = kind
        self.retryable = retryable
        # For kind == "status": the region's answer, relayed if no other region does better.
        self.status = status
        self.headers = headers
        self.body = body


class Tap(Protocol):
    """Sees what a cache miss sends the client (the response cache's tee)."""

    def chunk(self, data: bytes) -> None: ...
    def end(self, clean: bool) -> None: ...
    def body(self, status: int, content_type: str | None, body: bytes) -> None: ...


# Called after every attempt with (ctx, region, error or None, seconds): passive health, metrics.
AttemptHook = Callable[[RequestContext, Upstream, AttemptError | None, float], None]
Opener = Callable[[Upstream], Awaitable[Opened]]
# Whether another attempt may start (attempt cap, client deadline, retry budget); asked before
# every attempt, the first included (ctx.attempts == 0), so it can count requests.
RetryGate = Callable[[RequestContext], bool]
RETRY_GATE: web.AppKey[RetryGate] = web.AppKey("router.retry_gate")


class StreamGuard(Protocol):
    """Holds back partial SSE events so a broken stream can be resumed cleanly."""

    def feed(self, chunk: bytes) -> bytes: ...
    def settle(self) -> None: ...
    def flush(self) -> bytes: ...


class Midstream(Protocol):
    """The routing feature's answer to a stream that broke after bytes reached the client."""

    def track(self, ctx: RequestContext) -> StreamGuard | None: ...
    async def resume(
        self, request: web.Request, ctx: RequestContext, out: web.StreamResponse, reason: str
    ) -> bool: ...


MIDSTREAM: web.AppKey[Midstream] = web.AppKey("router.midstream")
# ctx.extra key: the regions this request may use, in order (mid-stream resume continues there).
CANDIDATES = "routing.candidates"
# The first-byte timeout of one attempt, given the configured one ([routing] ttft_timeout_s,
# capped by the client's deadline).
FirstByte = Callable[[RequestContext, float], float]
FIRST_BYTE: web.AppKey[FirstByte] = web.AppKey("router.first_byte")
# Wraps the opener of a request so a slow attempt can be hedged on the next region.
Hedger = Callable[
    [RequestContext, Sequence[Upstream], Opener, Sequence[AttemptHook], RetryGate | None], Opener
]
HEDGER: web.AppKey[Hedger] = web.AppKey("router.hedger")


def _media(headers: CIMultiDict[str]) -> str:
    return headers.get("Content-Type", "").partition(";")[0].strip().lower()


def _is_json(media: str) -> bool:
    return media == "application/json" or media.endswith("+json")


async def _read_capped(resp: http1.Response, region: str, max_bytes: int) -> bytes:
    """The whole body, or an AttemptError once it passes `max_bytes`."""
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise AttemptError(region, "too_large", f"response of {declared} bytes")
    parts: list[bytes] = []
    size = 0
    while chunk := await resp.content.readany():
        size += len(chunk)
        if size > max_bytes:
            raise AttemptError(region, "too_large", f"response over {max_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _check_success(region: str, status: int, headers: CIMultiDict[str], body: bytes) -> None:
    """A 2xx whole-body answer must be JSON: an HTML error page or a cut body is a failure."""
    if not 200 <= status < 300 or status == 204:
        return
    media = _media(headers)
    if not _is_json(media):
        raise AttemptError(region, "invalid", f"HTTP {status} with content type {media!r}")
    try:
        _RAW.decode(body)
    except msgspec.DecodeError as exc:
        raise AttemptError(region, "invalid", f"HTTP {status} body is not JSON ({exc})") from None


def _check_stream_start(region: str, headers: CIMultiDict[str], first: bytes) -> None:
    """A stream must be SSE from its first byte, or it is a failure of the region."""
    media = _media(headers)
    if media != "text/event-stream":
        raise AttemptError(region, "invalid", f"stream answered with content type {media!r}")
    if not first.lstrip(b"\r\n").startswith(_SSE_STARTS):
        raise AttemptError(region, "invalid", "stream does not start with an SSE field")


async def open_attempt(
    upstream: Upstream,
    ctx: RequestContext,
    headers: CIMultiDict[str],
    timeouts: TimeoutsConfig,
    max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> Opened:
    """Send the request to one region and read up to the point of no return (the first byte)."""
    parsed = ctx.request
    resp: http1.Response | None = None
    try:
        async with asyncio.timeout(timeouts.first_byte) as deadline:
            resp = await upstream.pool.post(
                upstream.path(ctx.endpoint), parsed.body, headers.items()
            )
            status = resp.status
            if parsed.stream and status == 200:
                # Committing to a region only once it produced body bytes lets a region that
                # dies between headers and first token be retried elsewhere.
                first = await resp.content.readany()
                if not first:
                    raise AttemptError(upstream.name, "disconnect", "empty stream")
                headers_out = response_headers(resp.headers)
                _check_stream_start(upstream.name, headers_out, first)
                return Opened(upstream, status, headers_out, response=resp, first=first)
            # Nothing is sent to the client until the whole body is read, so a failure reading
            # it can still go to another region; the pool's total timeout bounds it.
            deadline.reschedule(None)
            body = await _read_capped(resp, upstream.name, max_bytes)
            headers_out = response_headers(resp.headers)
            if status in RETRY_STATUSES:
                raise AttemptError(
                    upstream.name,
                    "status",
                    f"HTTP {status}",
                    status=status,
                    headers=headers_out,
                    body=body,
                )
            _check_success(upstream.name, status, headers_out, body)
            return Opened(upstream, status, headers_out, body=body)
    except AttemptError:
        if resp is not None:
            resp.close()
        raise
    except TimeoutError:
        if resp is not None:
            resp.close()
        raise AttemptError(upstream.name, "timeout", "no first byte in time") from None
    except http1.ConnectError as exc:
        raise AttemptError(upstream.name, "connect", str(exc)) from None
    except http1.ClientError as exc:
        if resp is not None:
            resp.close()
        raise AttemptError(upstream.name, "disconnect", str(exc) or type(exc).__name__) from None
    except BaseException:
        # Client gone (cancelled) or a bug: never leave the upstream request running.
        if resp is not None:
            resp.close()
        raise


async def attempt_loop(
    ctx: RequestContext,
    candidates: Sequence[Upstream],
    open_one: Opener,
    hooks: Sequence[AttemptHook] = (),
    gate: RetryGate | None = None,
) -> Opened:
    """Try `candidates` in order until one answers; raise the last AttemptError if none does."""
    last: AttemptError | None = None
    for upstream in candidates:
        if gate is not None and not gate(ctx):
            break
        ctx.attempts += 1
        ctx.region = upstream.name
        began = time.perf_counter()
        try:
            opened = await open_one(upstream)
        except AttemptError as exc:
            for hook in hooks:
                hook(ctx, upstream, exc, time.perf_counter() - began)
            last = exc
            if not exc.retryable:
                break
            log.warning("request %s: attempt %d failed: %s", ctx.request_id, ctx.attempts, exc)
            continue
        for hook in hooks:
            # opened.upstream: a hedged attempt may have been won by another region.
            hook(ctx, opened.upstream, None, time.perf_counter() - began)
        return opened
    if last is None:
        raise AttemptError("-", "connect", "no candidate regions", retryable=False)
    raise last


def failure_response(exc: AttemptError, request_id: str) -> web.Response:
    """What the client gets when every attempt failed: the last region's answer, or 502/504."""
    if exc.status is not None and exc.headers is not None:
        exc.headers["X-Request-Id"] = request_id
        return web.Response(status=exc.status, body=exc.body, headers=exc.headers)
    status = 504 if exc.kind == "timeout" else 502
    error = UpstreamError(
        f"No region could answer the request (last: {exc}).",
        status=status,
        code="upstream_timeout" if status == 504 else "upstream_error",
    )
    return error_response(error, request_id)


def error_response(error: ApiError, request_id: str) -> web.Response:
    """An ApiError in OpenAI's shape."""
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id, **error.headers}
    return web.Response(status=error.status, body=error.body(), headers=headers)


def _stream_error_event(message: str) -> bytes:
    """An SSE event OpenAI SDKs raise as an APIError, for a stream that broke mid-way."""
    body = UpstreamError(message, code="upstream_stream_error").body()
    return b"data: " + body + b"\n\n"


class _Truncated(Exception):
    """The region closed a stream cleanly but without `data: [DONE]`: it did not finish."""


class _TooLarge(Exception):
    """The region's stream passed [server] max_response_bytes."""


def _ends_done(tail: bytes) -> bool:
    return tail.rstrip().endswith(b"[DONE]")


def _boundary(guard: StreamGuard | None, tail: bytes) -> bytes:
    """What closes a half-sent event before an error event (a guard only sends whole events)."""
    if guard is not None or tail.endswith((b"\n\n", b"\r\n\r\n")):
        return b""
    return b"\n\n"


async def relay_stream(
    request: web.Request,
    ctx: RequestContext,
    opened: Opened,
    idle_timeout: float,
    tap: Tap | None = None,
    max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> web.StreamResponse:
    """Relay an upstream SSE stream chunk by chunk; write() waits for the client (backpressure).

    A stream that breaks, stalls, grows past `max_bytes` or ends without `[DONE]` never looks
    complete to the client: it is resumed elsewhere or ends with an SSE error event.
    """
    upstream = opened.response
    assert upstream is not None
    opened.headers["X-Request-Id"] = ctx.request_id
    resp = StreamResponse(status=opened.status, headers=opened.headers)
    # The usage an OpenAI stream reports last settles the request's token reservation.
    meter = request.get(METER)
    midstream = request.app.get(MIDSTREAM)
    guard = midstream.track(ctx) if midstream is not None else None
    complete = False
    # The stream's last bytes: whether it ended with [DONE], and whether it is between events.
    tail = opened.first[-64:]
    size = len(opened.first)
    try:
        await resp.prepare(request)
        await resp.write(opened.first if guard is None else guard.feed(opened.first))
        if guard is not None:
            guard.settle()
        if tap is not None:
            tap.chunk(opened.first)
        if meter is not None:
            meter.feed(opened.first)
        content = upstream.content
        try:
            async with IdleWatch(idle_timeout) as idle:
                while True:
                    idle.waiting()
                    chunk = await content.readany()
                    # A slow client is backpressure, not an idle upstream.
                    idle.busy()
                    # Under load several events are already buffered: one write, not one each.
                    more = content.read_nowait()
                    if more:
                        chunk += more
                    if not chunk:
                        if not _ends_done(tail):
                            raise _Truncated
                        if guard is not None:
                            await resp.write(guard.flush())
                        break
                    size += len(chunk)
                    if size > max_bytes:
                        raise _TooLarge
                    tail = chunk[-64:] if len(chunk) >= 64 else (tail + chunk)[-64:]
                    await resp.write(chunk if guard is None else guard.feed(chunk))
                    if guard is not None:
                        guard.settle()
                    if tap is not None:
                        tap.chunk(chunk)
                    if meter is not None:
                        meter.feed(chunk)
            complete = True
        # A failed write to the client is a ConnectionResetError (aiohttp's own subclasses it).
        except (http1.ClientError, ConnectionResetError, TimeoutError, _Truncated) as exc:
            transport = request.transport
            if transport is None or transport.is_closing():
                # A write to the client failed: it left, so there is nobody to tell.
                return resp
            if isinstance(exc, TimeoutError):
                reason = "idle timeout"
            elif isinstance(exc, _Truncated):
                reason = "stream ended without [DONE]"
            else:
                reason = str(exc) or "disconnect"
            log.warning("request %s: stream from %s broke: %s", ctx.request_id, ctx.region, reason)
            if midstream is None or not await midstream.resume(request, ctx, resp, reason):
                await resp.write(
                    _boundary(guard, tail)
                    + _stream_error_event(f"The region stopped mid-stream ({reason}).")
                )
        except _TooLarge:
            log.warning(
                "request %s: stream from %s over %d bytes", ctx.request_id, ctx.region, max_bytes
            )
            await resp.write(
                _boundary(guard, tail)
                + _stream_error_event(f"The region's answer exceeded {max_bytes} bytes.")
            )
    finally:
        if tap is not None:
            tap.end(complete)
        if complete:
            upstream.release()
        else:
            # Closing (not releasing) the connection is what tells the region to stop generating.
            upstream.close()
    await resp.write_eof()
    return resp


async def forward(
    request: web.Request,
    ctx: RequestContext,
    candidates: Sequence[Upstream],
    timeouts: TimeoutsConfig,
    hooks: Sequence[AttemptHook] = (),
    tap: Tap | None = None,
    max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> web.StreamResponse:
    """Send the parsed request to the first candidate that answers and relay its answer."""
    headers_in = request.headers
    # Admission: a region's in-flight slot is held from its attempt to the end of the answer.
    admission = request.app.get(ADMISSION)
    tenant = request.get(TENANT)
    priority = tenant.priority if tenant is not None else 0
    held: list[Slot] = []

    first_byte_of = request.app.get(FIRST_BYTE)
    ctx.extra[CANDIDATES] = list(candidates)

    async def open_one(upstream: Upstream) -> Opened:
        slot: Slot | None = None
        if admission is not None:
            try:
                slot = await admission.acquire(
                    upstream.name, priority=priority, last=upstream is candidates[-1]
                )
            except Spill as spill:
                # 429 "this region is full" says nothing of its health; relayed (with
                # Retry-After) only if no other attempt follows.
                full = admission.unavailable(upstream.name, spill.reason)
                full_headers = CIMultiDict({"Content-Type": "application/json", **full.headers})
                raise AttemptError(
                    upstream.name,
                    "spill",
                    spill.reason,
                    status=429,
                    headers=full_headers,
                    body=full.body(),
                ) from None
            held.append(slot)
            ctx.timer.record(QUEUE, int(slot.wait_s * 1e9))
            ctx.extra["queue_depth"] = slot.queue_depth
        headers = upstream.request_headers(headers_in, ctx.request_id)
        if tap is not None:
            # The cache records, stores and replays identity bytes: a compressed answer could
            # be neither parsed nor served to a later client that asked for another encoding.
            headers["Accept-Encoding"] = "identity"
        attempt_timeouts = timeouts
        if first_byte_of is not None:
            first_byte = first_byte_of(ctx, timeouts.first_byte)
            attempt_timeouts = msgspec.structs.replace(timeouts, first_byte=first_byte)
        try:
            return await open_attempt(upstream, ctx, headers, attempt_timeouts, max_bytes)
        except BaseException:
            # This attempt's own slot: with hedging two attempts hold slots at once.
            if slot is not None:
                held.remove(slot)
                slot.release()
            raise

    try:
        ctx.timer.begin("upstream")
        try:
            gate = request.app.get(RETRY_GATE)
            hedger = request.app.get(HEDGER)
            opener = open_one if hedger is None else hedger(ctx, candidates, open_one, hooks, gate)
            opened = await attempt_loop(ctx, candidates, opener, hooks, gate)
        except AttemptError as exc:
            ctx.timer.end("upstream")
            return failure_response(exc, ctx.request_id)
        ctx.timer.end("upstream")
        if opened.response is None:
            if tap is not None:
                tap.body(opened.status, opened.headers.get("Content-Type"), opened.body or b"")
            opened.headers["X-Request-Id"] = ctx.request_id
            return web.Response(status=opened.status, body=opened.body, headers=opened.headers)
        ctx.timer.begin("stream")
        try:
            return await relay_stream(request, ctx, opened, timeouts.idle, tap, max_bytes)
        finally:
            ctx.timer.end("stream")
    finally:
        for slot in held:
            slot.release()
