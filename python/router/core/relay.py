"""Relaying a region's answer to the client: a whole body, or an SSE stream chunk by chunk."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from aiohttp import web

from router.core.attempt import DEFAULT_MAX_RESPONSE_BYTES, Attempts
from router.core.context import RequestContext
from router.core.responses import anthropic_relayed, refusal_response
from router.core.stages import Continuer, Tap
from router.core.stream import (
    DEFAULT_MAX_EVENT_BYTES,
    DONE_EVENT,
    EventState,
    StreamState,
    passable,
)
from router.core.transport import UpstreamResponse
from router.core.upstream import Opened
from router.net import http1, sse
from router.net.idle import IdleWatch
from router.net.stream_response import StreamResponse

log = logging.getLogger("router")


class _Truncated(Exception):
    """The region ended a stream that had not finished (see core.stream)."""


class _TooLarge(Exception):
    """The region's stream passed [server] max_response_bytes."""


# Streams still read, and continuations still going, for the cache's other readers after the
# client that started them left (kept referenced until they end).
_DRAINING: set[asyncio.Future[Any]] = set()


async def _drain(
    upstream: UpstreamResponse,
    splitter: sse.Splitter,
    state: StreamState | EventState,
    tap: Tap,
    idle_timeout: float,
    room: int,
    scrub: Callable[[bytes], bytes] | None,
    broke: Callable[[], None] | None,
) -> None:
    """Read the rest of a stream into the tap alone while others still read this exchange;
    once none does, stop (closing the connection tells the region to stop generating). A
    stream that breaks on the way is reported (`broke`) as the relay's own would be."""
    complete = False
    # Whether the region broke the stream (reading stopped because nobody wants the rest, it
    # grew too large, the exchange's own deadline or a shutdown are none of its doing).
    broken = False
    content = upstream.content
    try:
        async with IdleWatch(idle_timeout) as idle:
            while True:
                idle.waiting()
                chunk = await content.readany()
                idle.busy()
                if not chunk:
                    break
                room -= len(chunk)
                if room < 0 or not tap.wanted():
                    return
                data = passable(splitter.feed(chunk), state, False)
                if data:
                    tap.chunk(data if scrub is None else scrub(data))
                if state.error is not None:
                    break
        if splitter.pending and state.error is None:
            data = passable(splitter.end(), state, False)
            if data:
                tap.chunk(data if scrub is None else scrub(data))
        complete = state.complete
        broken = not complete  # it ended before finishing, or with its error event
        if complete and state.owes_done:
            tap.chunk(DONE_EVENT)
    except (http1.ClientError, TimeoutError, sse.EventTooLarge) as exc:
        log.warning("stream kept for coalesced readers broke: %s", exc)
        broken = not isinstance(exc, http1.TotalDeadline)
    finally:
        tap.end(complete)
        if complete:
            upstream.release()
        else:
            upstream.close()
        if broken and broke is not None:
            broke()


def _hand_off(
    ctx: RequestContext,
    upstream: UpstreamResponse,
    splitter: sse.Splitter,
    state: StreamState | EventState,
    tap: Tap,
    idle_timeout: float,
    room: int,
    scrub: Callable[[bytes], bytes] | None,
    broke: Callable[[RequestContext, str], None] | None,
) -> None:
    """The rest of the stream goes to a background reader (`ctx.background`)."""
    tap.detach()
    region = ctx.region
    on_broken = None if broke is None or region is None else partial(broke, ctx, region)
    task = asyncio.get_running_loop().create_task(
        _drain(upstream, splitter, state, tap, idle_timeout, room, scrub, on_broken)
    )
    ctx.background = task
    _DRAINING.add(task)
    task.add_done_callback(_DRAINING.discard)


def _finish_in_background(ctx: RequestContext, going: asyncio.Future[bool], tap: Tap) -> None:
    """A continuation that outlived its client ends its tap when it ends."""

    def ended(task: asyncio.Future[bool]) -> None:
        whole = not task.cancelled() and task.exception() is None and task.result()
        tap.end(whole, storable=False)

    going.add_done_callback(ended)
    ctx.background = going
    _DRAINING.add(going)
    going.add_done_callback(_DRAINING.discard)


def whole(ctx: RequestContext, opened: Opened, tap: Tap | None) -> web.Response:
    """A region's whole (non-stream) answer, byte-exact; on the Messages API a relayed error
    in Anthropic's shape (core.responses.anthropic_relayed); an error answer that is no API
    error replaced by the router's own (core.responses.refusal_response)."""
    body = opened.body or b""
    if opened.status >= 400:
        anthropic = ctx.dialect.anthropic
        own = refusal_response(
            opened.status, opened.headers, body, ctx.request_id, anthropic=anthropic
        )
        if own is not None:
            if tap is not None:
                tap.refused(own)
            return own
        if anthropic:
            body = anthropic_relayed(opened.status, body)
    if tap is not None:
        tap.body(opened.status, opened.headers, body)
    opened.headers["X-Request-Id"] = ctx.request_id
    return web.Response(status=opened.status, body=body, headers=opened.headers)


async def relay_stream(
    request: web.Request,
    ctx: RequestContext,
    opened: Opened,
    idle_timeout: float,
    *,
    tap: Tap | None = None,
    max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    continuer: Continuer | None = None,
    attempts: Attempts | None = None,
    strip_usage: bool = False,
    on_id: Callable[[str], None] | None = None,
    broke: Callable[[RequestContext, str], None] | None = None,
) -> web.StreamResponse:
    """Relay an upstream SSE stream event by event; write() waits for the client (backpressure).

    Only whole events go out (one scan of the bytes, each event at most `max_event_bytes`);
    events that are not JSON are dropped. A stream that breaks, stalls, grows too large, sends
    an error event or ends before every choice finished never looks complete to the client: it
    is continued elsewhere or ends with an SSE error event. One that finished every choice is
    complete whatever follows; without `[DONE]` it gets it added. `on_id` hears the id a
    Responses API stream announces, as soon as it does, and its output items' ids once it
    ended. `broke` hears of a break the background reader saw after the client left (the
    continuer reports the others).
    """
    upstream = opened.response
    assert upstream is not None
    opened.headers["X-Request-Id"] = ctx.request_id
    resp = StreamResponse(status=opened.status, headers=opened.headers)
    # The usage an OpenAI stream reports last settles the request's token reservation.
    meter = ctx.meter
    guard = continuer.track(ctx) if continuer is not None else None
    splitter = sse.Splitter(max_event_bytes)
    state = ctx.dialect.tracker()
    ctx.reported = state.usage
    complete = False
    # Every choice finished, then the region's connection broke: whole for the client and
    # for the cache's readers, but the connection is not reused.
    whole_then_broke = False
    # Whether another region finished the stream (a continuation after a break).
    continued = False
    # Whether the rest of the stream went to a background reader (the client left, others read).
    handed = False
    size = 0

    async def send(data: bytes) -> None:
        if tap is not None:
            # Before the write: a client that leaves during it takes nothing from the others
            # reading this exchange (coalesced requests, the cache entry).
            tap.chunk(data)
        if meter is not None:
            # Before the write too: the region generated it whether or not the client takes it.
            meter.feed(data)
        await resp.write(data if guard is None else guard.feed(data))
        if guard is not None:
            guard.settle()

    # The client left during a continuation that others still read: it goes on for them.
    gone = False

    async def send_on(data: bytes) -> None:
        # A continuation's events (its seam tracks and meters them): to the client and to
        # whoever else reads this exchange.
        nonlocal gone
        if tap is not None:
            tap.chunk(data)
        if not gone:
            try:
                await resp.write(data)
            except ConnectionError:
                if tap is None or not tap.wanted():
                    raise
                gone = True
                tap.detach()
        elif tap is None or not tap.wanted():
            raise ConnectionResetError("nobody reads this stream any more")

    def hand_off(tap: Tap) -> bool:
        # The rest of the stream to a background reader, for the others reading it.
        _hand_off(ctx, upstream, splitter, state, tap, idle_timeout, max_bytes - size, scrub, broke)
        return True

    # on_id is let go once it heard the response's id; the items come at the end.
    on_items = on_id
    plain = guard is None and tap is None and meter is None
    # The region's own key never reaches the client in its events (nor the cache).
    scrub = opened.upstream.scrub if opened.upstream.has_secret else None
    try:
        await resp.prepare(request)
        content = upstream.content
        chunk = opened.first
        try:
            async with IdleWatch(idle_timeout, ctx.loop) as idle:
                while chunk:
                    size += len(chunk)
                    if size > max_bytes:
                        raise _TooLarge
                    stripped: list[bytes] | None = [] if strip_usage else None
                    data = passable(splitter.feed(chunk), state, strip_usage, stripped)
                    if scrub is not None and data:
                        data = scrub(data)
                    if on_id is not None and isinstance(state, EventState) and state.response_id:
                        on_id(state.response_id)
                        on_id = None
                    if stripped and meter is not None:
                        # Before the write: the usage the region reported counts if the client
                        # leaves during it.
                        meter.feed(b"".join(stripped))
                    if data:
                        if plain:
                            await resp.write(data)  # no one else reads the bytes: no detour
                        else:
                            await send(data)
                    if state.error is not None:
                        break  # the region's error event: its stream ends there
                    idle.waiting()
                    chunk = await content.readany()
                    # A slow client is backpressure, not an idle upstream.
                    idle.busy()
                    # Under load several events are already buffered: one write, not one each.
                    more = content.read_nowait()
                    if more:
                        chunk += more
            if splitter.pending and state.error is None:
                # The region's last event, only its blank line missing (`data: [DONE]\n`).
                stripped = [] if strip_usage else None
                data = passable(splitter.end(), state, strip_usage, stripped)
                if stripped and meter is not None:
                    meter.feed(b"".join(stripped))
                if data:
                    await send(data if scrub is None else scrub(data))
            # A finished stream is complete whatever unended bytes follow (a stray newline).
            if not state.complete:
                cut = splitter.pending and state.error is None
                raise _Truncated("stream ended mid-event" if cut else state.cut_reason)
            if state.owes_done:
                await send(DONE_EVENT)
            complete = True
            if on_items is not None and isinstance(state, EventState):
                for item in state.items:
                    on_items(item)
            if state.failed:
                # A Responses or Messages stream the region ended with its failure event.
                ctx.broken = "The region ended the stream with its failure event."
        # A failed write to the client is a ConnectionResetError (aiohttp's own subclasses it).
        except (
            http1.ClientError,
            ConnectionResetError,
            TimeoutError,
            _Truncated,
            sse.EventTooLarge,
        ) as exc:
            transport = request.transport
            if transport is None or transport.is_closing():
                # A write to the client failed: it left, so there is nobody to tell; but the
                # cache's coalesced readers of this exchange still get the whole answer.
                if tap is not None and tap.wanted() and not isinstance(exc, _Truncated):
                    handed = hand_off(tap)
                return resp
            if state.complete and not isinstance(exc, _Truncated):
                # Every choice finished before the region's connection broke (a reset after
                # [DONE], junk after the last chunk): the answer is whole; nothing to resume.
                if state.owes_done:
                    await send(DONE_EVENT)
                whole_then_broke = True
                log.warning(
                    "request %s: %s's connection broke after a complete stream: %s",
                    ctx.request_id,
                    ctx.region,
                    str(exc) or "disconnect",
                )
                await resp.write_eof()
                return resp
            # The exchange's total deadline is the router's own bound, however its time went
            # (a slow client holds the relay): no failure of the region, nothing to continue.
            overtime = isinstance(exc, http1.TotalDeadline)
            if overtime:
                reason = "the exchange passed timeouts.total"
            elif isinstance(exc, TimeoutError):
                reason = "idle timeout"
            else:
                reason = str(exc) or "disconnect"
            if scrub is not None and state.error is not None:
                reason = scrub(reason.encode()).decode(errors="replace")  # the region's words
            log.warning("request %s: stream from %s broke: %s", ctx.request_id, ctx.region, reason)
            if continuer is not None and attempts is not None and not overtime:
                going = asyncio.ensure_future(
                    continuer.resume(
                        ctx, send_on, attempts.again, reason, idle_timeout, max_bytes - size
                    )
                )
                try:
                    continued = await asyncio.shield(going)
                except asyncio.CancelledError:
                    # The client left (aiohttp cancels its handler): the continuation goes on
                    # for those still reading this exchange, and its end settles their flight.
                    if tap is not None and tap.wanted():
                        gone = handed = True
                        tap.detach()
                        _finish_in_background(ctx, going, tap)
                        upstream.close()
                    else:
                        going.cancel()
                    raise
                if gone:
                    return resp  # finished for the others; its client is not there to end it
            if not continued:
                message = (
                    "The answer took longer than the router allows one exchange."
                    if overtime
                    else f"The region stopped mid-stream ({reason})."
                )
                await resp.write(ctx.stream_failure(message, state))
        except _TooLarge:
            log.warning(
                "request %s: stream from %s over %d bytes", ctx.request_id, ctx.region, max_bytes
            )
            message = f"The region's answer exceeded {max_bytes} bytes."
            await resp.write(ctx.stream_failure(message, state))
        except asyncio.CancelledError:
            # The client left (aiohttp cancels its handler): others may still read this.
            if tap is not None and tap.wanted():
                handed = hand_off(tap)
            raise
        if state.invalid:
            log.warning(
                "request %s: dropped %d events from %s that were not JSON",
                ctx.request_id,
                state.invalid,
                ctx.region,
            )
    except Exception as exc:
        if not resp.prepared:
            raise
        # Past the stream's head nothing may answer again: a client that left is let go; a
        # bug gets the client one error event and a clean end, never a second response.
        if not isinstance(exc, ConnectionError):
            log.exception("request %s: relaying from %s failed", ctx.request_id, ctx.region)
            with contextlib.suppress(ConnectionError):
                await resp.write(ctx.stream_failure("The router failed mid-stream.", state))
                await resp.write_eof()
        return resp
    finally:
        if not handed:
            if tap is not None:
                tap.end(complete or continued or whole_then_broke, storable=not continued)
            if complete:
                upstream.release()
            else:
                # Closing (not releasing) the connection tells the region to stop generating.
                upstream.close()
    await resp.write_eof()
    return resp
