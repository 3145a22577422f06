"""Relaying a region's answer to the client: a whole body, or an SSE stream chunk by chunk."""

from __future__ import annotations

import logging

from aiohttp import web

from router.core.attempt import DEFAULT_MAX_RESPONSE_BYTES, Attempts
from router.core.context import RequestContext
from router.core.responses import stream_error_event
from router.core.stages import Continuer, StreamGuard, Tap
from router.core.upstream import Opened
from router.net import http1
from router.net.idle import IdleWatch
from router.net.stream_response import StreamResponse

log = logging.getLogger("router")


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


def whole(ctx: RequestContext, opened: Opened, tap: Tap | None) -> web.Response:
    """A region's whole (non-stream) answer, byte-exact."""
    if tap is not None:
        tap.body(opened.status, opened.headers.get("Content-Type"), opened.body or b"")
    opened.headers["X-Request-Id"] = ctx.request_id
    return web.Response(status=opened.status, body=opened.body, headers=opened.headers)


async def relay_stream(
    request: web.Request,
    ctx: RequestContext,
    opened: Opened,
    idle_timeout: float,
    *,
    tap: Tap | None = None,
    max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    continuer: Continuer | None = None,
    attempts: Attempts | None = None,
) -> web.StreamResponse:
    """Relay an upstream SSE stream chunk by chunk; write() waits for the client (backpressure).

    A stream that breaks, stalls, grows past `max_bytes` or ends without `[DONE]` never looks
    complete to the client: it is continued elsewhere or ends with an SSE error event.
    """
    upstream = opened.response
    assert upstream is not None
    opened.headers["X-Request-Id"] = ctx.request_id
    resp = StreamResponse(status=opened.status, headers=opened.headers)
    # The usage an OpenAI stream reports last settles the request's token reservation.
    meter = ctx.meter
    guard = continuer.track(ctx) if continuer is not None else None
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
            resumed = False
            if continuer is not None and attempts is not None:
                resumed = await continuer.resume(ctx, resp, attempts.again, reason)
            if not resumed:
                await resp.write(
                    _boundary(guard, tail)
                    + stream_error_event(f"The region stopped mid-stream ({reason}).")
                )
        except _TooLarge:
            log.warning(
                "request %s: stream from %s over %d bytes", ctx.request_id, ctx.region, max_bytes
            )
            await resp.write(
                _boundary(guard, tail)
                + stream_error_event(f"The region's answer exceeded {max_bytes} bytes.")
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
