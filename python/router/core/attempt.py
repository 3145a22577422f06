"""Attempts at regions: one path for the first try, failover, hedges and continuations.

`Attempts` holds one request's attempts (Envoy's UpstreamRequest per attempt, RetryState per
request): each goes through admission, the region's transport and the attempt observers the
same way, whatever started it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from multidict import CIMultiDict

from router.config import TimeoutsConfig
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind, Origin, Spill, overflows_context
from router.core.stages import AttemptObserver, Hedger, Opener, RetryPolicy, Slot, SlotGate
from router.core.stream import (
    DEFAULT_MAX_EVENT_BYTES,
    error_message,
    is_error_event,
    payload_of,
    region_failure,
)
from router.core.timing import QUEUE
from router.core.transport import UpstreamResponse
from router.core.upstream import Opened, Upstream
from router.errors import InvalidRequest, UpstreamError
from router.net import http1, sse
from router.net.idle import Deadline

log = logging.getLogger("router")
# A region shedding load (or the ingress in front of it saying it is down) answers 503: the
# same page from two regions says nothing about the request.
_SHEDDING = 503

# Statuses that mean "this region cannot take it now, another may": retried before the first byte.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A region refusing the router's credentials (the client's never reach it).
_CREDENTIALS = frozenset({401, 403, 407})
# A region's answer body above this is a failure of the region ([server] max_response_bytes).
DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
# What an SSE stream's first line may start with (a field name, or a comment), after a byte
# order mark (the SSE spec allows one) and blank lines, which are dropped.
_SSE_STARTS = (b"data:", b":", b"event:", b"id:", b"retry:")
_SSE_LEAD = re.compile(rb"(?:\xef\xbb\xbf)?[\r\n]*")
# A stream's bytes before its first token (preamble events, comments) are held back, at most
# this many (else the attempt fails): a Responses stream's preamble repeats the request's
# instructions and tools in up to three events of at most max_event_bytes each.
_MAX_OPENING_BYTES = 4 * DEFAULT_MAX_EVENT_BYTES


class _Answer(msgspec.Struct):
    """A whole answer's top level: an object (of any fields), with no `error` in it (but a
    Responses object, whose `error` says why it failed: relayed as the region's answer)."""

    error: Any = None
    object: Any = None


_ANSWER = msgspec.json.Decoder(_Answer)
# Error codes that say the request itself is at fault, whatever the status they come with.
_REQUEST_CODES = frozenset(
    {
        "context_length_exceeded",
        "invalid_request_error",
        "content_policy_violation",
        "content_filter",
        "invalid_prompt",
        "string_above_max_length",
    }
)
# Failures after which the next attempt is free of the retry budget (see RequestContext).
_FREE = frozenset(
    {FailureKind.CONNECT, FailureKind.SPILL, FailureKind.UNSUPPORTED, FailureKind.UNSERVED}
)
# Server kinds that may be llama.cpp's server or llama-cpp-python (which answer a request they
# cannot take with a 500): another kind's 500 is a server error whatever it says.
_REFUSES_WITH_500 = frozenset({"llama-server", "llama-cpp-python", "sim", "generic"})
# How llama.cpp's server words the request errors it answers with a 500 (a std::runtime_error
# while reading the request: tools/server/server-common.cpp, server-chat.cpp): an input or a
# parameter this server cannot take, or a request it cannot read.
_SERVER_REFUSALS = (
    " input is not supported",
    "Unsupported param: ",
    " param requires --jinja flag",
    "Multimodal data provided, but model does not support",
    "Only no echo is supported",
    "Cannot use both json_schema and grammar",
    '"prompt" ',
    "'messages' is required",
    "Invalid base64 value",
    "Failed to download image",
    "Failed to load image or audio file",
    "Failed to tokenize prompt",
    "for mtmd, input prompt must be a string",
    # llama-cpp-python's: its route handler answers FastAPI's check of the request body (a
    # field it does not take, a json_schema response_format, a role it does not know) with a
    # 500 internal_server_error quoting the check's errors (llama_cpp/server/errors.py).
    "'loc': ('body',",
)
# Same-region retries wait this long (times 2^n, jittered), unless the region said how long.
_BACKOFF_S = 0.25
# At most this many attempts at one region for one request.
_PER_REGION = 2


class _ErrorDetail(msgspec.Struct):
    type: str | None = None
    code: str | int | None = None
    message: str | None = None


class _ErrorBody(msgspec.Struct):
    error: _ErrorDetail | str | None = None


_ERROR = msgspec.json.Decoder(_ErrorBody)


class _FlatError(_ErrorDetail):
    """vLLM's error shape: the error's fields at the top level (`"object": "error"`)."""

    object: str | None = None


_FLAT_ERROR = msgspec.json.Decoder(_FlatError)
# How servers word "no model by this name" in a 404, whole: vLLM's (OpenAIServing._check_model),
# OpenAI's (which also says code model_not_found), llama.cpp's router mode's, Anthropic's.
_NO_MODEL = (
    "The model `{}` does not exist.",
    "The model `{}` does not exist or you do not have access to it.",
    "model name={} is not found",
    "model: {}",
)


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[object] | None = None
    reasoning_content: str | None = None
    refusal: str | None = None


class _TokenChoice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _TokenChunk(msgspec.Struct):
    choices: list[_TokenChoice] | None = None


_TOKEN = msgspec.json.Decoder(_TokenChunk)


def has_token(event: bytes) -> bool:
    """Whether one whole event of a stream is its first token: content, the stream's end or an
    error; not a comment, a field without data (`id:`, `retry:`) or a role preamble. What a
    stream's time to first token waits for."""
    payload = payload_of(event)
    if not payload:
        return False
    # Without a role or an empty content: the usual token, not decoded.
    return (b'"role"' not in payload and b'"content":""' not in payload) or carries_token(payload)


def carries_token(payload: bytes) -> bool:
    """Whether one event's data is a token (or the stream's end), not a role preamble."""
    if payload == sse.DONE:
        return True
    try:
        chunk = _TOKEN.decode(payload)
    except (msgspec.MsgspecError, RecursionError):
        return True  # not a chat chunk this check understands: do not hold it back
    if chunk.choices is None:
        return True
    for choice in chunk.choices:
        d = choice.delta
        if choice.text or choice.finish_reason is not None:
            return True
        if d is not None and (d.content or d.tool_calls or d.reasoning_content or d.refusal):
            return True
    return False


_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def with_usage(body: bytes) -> bytes:
    """A stream request that also asks for the usage chunk (stream_options.include_usage)."""
    fields = _FIELDS.decode(body)
    options: dict[str, object] = {}
    raw = fields.get("stream_options")
    if raw is not None:
        decoded = msgspec.json.decode(raw)
        if isinstance(decoded, dict):
            options = decoded
    options["include_usage"] = True
    fields["stream_options"] = msgspec.Raw(msgspec.json.encode(options))
    return msgspec.json.encode(fields)


def _error_detail(body: bytes) -> _ErrorDetail | None:
    """An error answer's `error` object, when it has one of OpenAI's shape."""
    if b"error" not in body:
        return None
    try:
        error = _ERROR.decode(body).error
    except (msgspec.MsgspecError, RecursionError):
        return None
    return error if isinstance(error, _ErrorDetail) else None


def caused_by_request(body: bytes) -> bool:
    """Whether an error answer blames the request (OpenAI's invalid_request_error shape)."""
    error = _error_detail(body)
    if error is None:
        return False
    return error.type == "invalid_request_error" or (
        isinstance(error.code, str) and error.code in _REQUEST_CODES
    )


def missing_model(body: bytes, model: str) -> bool:
    """Whether a region's 404 says it has no model `model` (not a path it lacks, nor a stored
    response it does not hold): an API error, in OpenAI's shape or vLLM's flat one, with code
    model_not_found, or whose whole message is a server's own words for it with the model's
    name (a message that only quotes the request, such as an unknown id that names the model,
    is not: the request must not be able to make its own 404 count against a region)."""
    if not model or (model.encode() not in body and b"model_not_found" not in body):
        return False
    error = _error_detail(body)
    if error is None:
        try:
            flat = _FLAT_ERROR.decode(body)
        except (msgspec.MsgspecError, RecursionError):
            return False
        if flat.object != "error":
            return False
        error = flat
    if error.code == "model_not_found":
        return True
    message = error.message
    return isinstance(message, str) and message in {w.format(model) for w in _NO_MODEL}


def server_refusal(body: bytes) -> str | None:
    """The message of a 500 that is llama.cpp's server (or llama-cpp-python) refusing the
    request it read (an input or parameter it cannot take), else None."""
    error = _error_detail(body)
    if error is None or not isinstance(error.message, str):
        return None
    message = error.message
    return message if any(part in message for part in _SERVER_REFUSALS) else None


def _unsupported(name: str, message: str) -> AttemptError:
    """A region's 500 refusing the request, as the 400 it is (SDKs retry a 500 by themselves)."""
    error = InvalidRequest(
        f"The region cannot serve this request: {message[:300]}", code="unsupported_by_region"
    )
    return AttemptError(
        name,
        FailureKind.UNSUPPORTED,
        f"HTTP 500: {message[:200]}",
        status=400,
        headers=CIMultiDict({"Content-Type": "application/json"}),
        body=error.body(),
    )


# A delay as a number of seconds (or ms) is digits, maybe a fraction: not Python's float()
# syntax, which takes "1_0", "1e3", "nan" and "inf".
_DECIMAL = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")


def retry_after(headers: CIMultiDict[str]) -> float | None:
    """Seconds the region asked to wait: retry-after-ms, else Retry-After (seconds)."""
    for name, scale in (("retry-after-ms", 0.001), ("Retry-After", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        number = raw.strip()
        if not _DECIMAL.fullmatch(number):
            continue  # an HTTP date (not worth parsing for a retry within one request), or junk
        return float(number) * scale
    return None


def media_type(headers: CIMultiDict[str]) -> str:
    """An answer's media type, lowercase, without parameters."""
    return headers.get("Content-Type", "").partition(";")[0].strip().lower()


def unrelayable(status: int) -> str | None:
    """Why a region's answer with `status` is never relayed to the client, or None."""
    if status in _CREDENTIALS:
        # About the router's key, not the client's: never relayed as the client's own (nor its
        # detail, which may quote the key); another region may take it.
        return "key refused"
    if 300 <= status < 400:
        # Relayed, a redirect would send the client (and its prompt) somewhere else.
        return "redirect"
    if status >= 600:
        # Three digits the parser took, but no HTTP status (RFC 9110 15: 100-599).
        return "not a status"
    return None


def check_identity(region: str, headers: CIMultiDict[str]) -> None:
    """An answer asked for in identity bytes must come so: anything else cannot be checked,
    cached, scrubbed or trusted."""
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise AttemptError(region, FailureKind.INVALID, f"content encoding {encoding!r}")


def _is_json(media: str) -> bool:
    return media == "application/json" or media.endswith("+json")


async def read_capped(resp: UpstreamResponse, region: str, max_bytes: int) -> bytes:
    """The whole body, or an AttemptError once it passes `max_bytes`."""
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise AttemptError(region, FailureKind.TOO_LARGE, f"response of {declared} bytes")
    parts: list[bytes] = []
    size = 0
    while chunk := await resp.content.readany():
        size += len(chunk)
        if size > max_bytes:
            raise AttemptError(region, FailureKind.TOO_LARGE, f"response over {max_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _check_success(region: str, status: int, headers: CIMultiDict[str], body: bytes) -> None:
    """A 2xx whole-body answer must be a JSON object that is no error: an HTML error page, a
    cut body, a 204, `null`, or `{"error": ...}` under a 200 is a failure."""
    if not 200 <= status < 300:
        return
    if status == 204:
        raise AttemptError(region, FailureKind.INVALID, "HTTP 204: no answer")
    media = media_type(headers)
    if not _is_json(media):
        detail = f"HTTP {status} with content type {media!r}"
        raise AttemptError(region, FailureKind.INVALID, detail)
    try:
        answer = _ANSWER.decode(body)
    except (msgspec.MsgspecError, RecursionError) as exc:
        raise AttemptError(
            region, FailureKind.INVALID, f"HTTP {status} body is not a JSON object ({exc})"
        ) from None
    if answer.error is not None and answer.object != "response":
        raise AttemptError(region, FailureKind.INVALID, f"HTTP {status} with an error in its body")


def _check_stream_start(
    region: str, headers: CIMultiDict[str], first: bytes | bytearray, ended: bool = False
) -> int | None:
    """Where a stream's first line starts (past a byte order mark and blank lines), once that
    line is whole or the stream ended, else None; it must be an SSE field, or the stream is a
    failure of the region."""
    media = media_type(headers)
    if media != "text/event-stream":
        raise AttemptError(
            region, FailureKind.INVALID, f"stream answered with content type {media!r}"
        )
    match = _SSE_LEAD.match(first)
    start = match.end() if match is not None else 0
    if not ended and first.find(b"\n", start) < 0 and first.find(b"\r", start) < 0:
        return None  # a field's name may still be on its way (`da`, then `ta: ...`)
    if not first.startswith(_SSE_STARTS, start):
        raise AttemptError(region, FailureKind.INVALID, "stream does not start with an SSE field")
    return start


async def open_attempt(
    upstream: Upstream,
    ctx: RequestContext,
    body: bytes,
    headers: CIMultiDict[str],
    first_byte_s: float,
    max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    idle_s: float = math.inf,
) -> Opened:
    """Send `body` to one region and read up to the point of no return (the first byte)."""
    stream = ctx.request.stream
    resp: UpstreamResponse | None = None
    name = upstream.name
    reading = False
    try:
        async with Deadline(first_byte_s, ctx.loop) as deadline:
            resp = await upstream.pool.post(upstream.path(ctx.endpoint), body, headers.items())
            status = resp.status
            if stream and status == 200:
                # Committing to a region only once it produced its first token lets a region
                # that dies between headers and first token be retried elsewhere.
                first = await resp.content.readany()
                if not first:
                    # A clean end before any byte: the server refused the request its own way
                    # (llama-cpp-python answers a prompt over its context so); every region
                    # would, so it is one clean error, tried nowhere else.
                    error = UpstreamError(
                        "The region ended the stream before sending anything; the prompt may "
                        "exceed the model's context.",
                        code="empty_stream",
                    )
                    raise AttemptError(
                        name,
                        FailureKind.REQUEST,
                        "empty stream",
                        retryable=False,
                        status=502,
                        headers=CIMultiDict({"Content-Type": "application/json"}),
                        body=error.body(),
                    )
                headers_out = upstream.response_headers(resp.headers)
                check_identity(name, headers_out)
                # What comes before the first token is held back: bounded, each byte read once.
                limit = min(max_bytes, _MAX_OPENING_BYTES)
                start = _check_stream_start(name, headers_out, first)
                if start is None:
                    held = bytearray(first)
                    while start is None:
                        more = await resp.content.readany()
                        held += more
                        if len(held) > limit:
                            raise AttemptError(
                                name, FailureKind.INVALID, f"no SSE line in {limit} bytes"
                            )
                        start = _check_stream_start(name, headers_out, held, ended=not more)
                    first = bytes(held)
                if start:
                    first = first[start:]
                # The first token, within the same deadline: a region that sends its headers
                # and role preamble (or keep-alive comments) at once, then nothing, is as slow
                # as a silent one.
                token = ctx.dialect.has_token or has_token
                # Events are bounded by the relay (max_event_bytes); here only the bytes before
                # the first token are, each looked at once.
                splitter = sse.Splitter(max_bytes)
                at = splitter.first(first, token)
                if at is None:
                    parts = [first]
                    size = len(first)
                    while at is None:
                        more = await resp.content.readany()
                        if not more:
                            break
                        size += len(more)
                        if size > limit:
                            raise AttemptError(
                                name, FailureKind.INVALID, f"no first token in {limit} bytes"
                            )
                        parts.append(more)
                        at = splitter.first(more, token)
                    first = b"".join(parts)
                if at is not None and not ctx.dialect.events and b'"error"' in at:
                    # An error event before any token (vLLM's failure inside a stream): a failed
                    # attempt, as a 5xx is, unless it blames the request.
                    payload = payload_of(at)
                    if payload is not None and is_error_event(payload):
                        said = upstream.scrub(payload)
                        request = caused_by_request(said)
                        raise AttemptError(
                            name,
                            FailureKind.REQUEST if request else FailureKind.STATUS,
                            f"{error_message(said)} before any token",
                            retryable=not request,
                            status=400 if request else 502,
                            headers=CIMultiDict({"Content-Type": "application/json"}),
                            body=said,
                        )
                if at is not None and ctx.dialect.events and b'"error"' in at:
                    # The same for the Responses and Messages APIs' failure event (`error`,
                    # `response.failed`) when it blames the region; one that blames the
                    # request is relayed as the region's answer.
                    payload = payload_of(at)
                    failure = region_failure(upstream.scrub(payload)) if payload else None
                    if failure is not None:
                        blamed, fault = failure
                        answer = msgspec.json.encode({"error": fault})
                        raise AttemptError(
                            name,
                            FailureKind.STATUS,
                            f"{error_message(answer)} before any token",
                            status=blamed,
                            headers=CIMultiDict({"Content-Type": "application/json"}),
                            body=answer,
                        )
                return Opened(upstream, status, headers_out, response=resp, first=first)
            # Nothing is sent to the client until the whole body is read, so a failure reading
            # it can still go to another region; it must come within a stream's idle timeout
            # of the head (regions send a whole answer's body at once, after generating it).
            deadline.reset(idle_s)
            reading = True
            whole = upstream.scrub(await read_capped(resp, name, max_bytes))
            headers_out = upstream.response_headers(resp.headers)
            check_identity(name, headers_out)
            why = unrelayable(status)
            if why is not None:
                raise AttemptError(name, FailureKind.INVALID, f"HTTP {status}: {why}")
            if status == 404 and missing_model(whole, ctx.request.upstream_model):
                # The router's config says it serves the model, the region says it has none by
                # that name: its config drifted. Another region may have it.
                raise AttemptError(
                    name,
                    FailureKind.UNSERVED,
                    f"HTTP 404: no model {ctx.request.upstream_model!r} there",
                    status=status,
                    headers=headers_out,
                    body=whole,
                )
            if status in RETRY_STATUSES:
                refusal = (
                    server_refusal(whole)
                    if status == 500 and upstream.config.kind in _REFUSES_WITH_500
                    else None
                )
                if refusal is not None:
                    raise _unsupported(name, refusal)
                if caused_by_request(whole):
                    raise AttemptError(
                        name,
                        FailureKind.REQUEST,
                        f"HTTP {status}: the request was refused",
                        retryable=False,
                        status=status,
                        headers=headers_out,
                        body=whole,
                    )
                raise AttemptError(
                    name,
                    FailureKind.STATUS,
                    f"HTTP {status}",
                    status=status,
                    headers=headers_out,
                    body=whole,
                    retry_after_s=retry_after(headers_out),
                )
            if status in (400, 413) and overflows_context(whole):
                # Too long for this model: no region of it can answer, a larger one may.
                raise AttemptError(
                    name,
                    FailureKind.REQUEST,
                    f"HTTP {status}: context length exceeded",
                    retryable=False,
                    status=status,
                    headers=headers_out,
                    body=whole,
                )
            _check_success(name, status, headers_out, whole)
            return Opened(upstream, status, headers_out, body=whole)
    except AttemptError:
        if resp is not None:
            resp.close()
        raise
    except TimeoutError:
        if resp is not None:
            resp.close()
        late = "the body stalled" if reading else "no first byte in time"
        raise AttemptError(name, FailureKind.TIMEOUT, late) from None
    except http1.ConnectError as exc:
        raise AttemptError(name, FailureKind.CONNECT, str(exc)) from None
    except sse.EventTooLarge as exc:
        if resp is not None:
            resp.close()
        raise AttemptError(name, FailureKind.TOO_LARGE, str(exc)) from None
    except http1.ClientError as exc:
        if resp is not None:
            resp.close()
        detail = str(exc) or type(exc).__name__
        raise AttemptError(name, FailureKind.DISCONNECT, detail) from None
    except BaseException:
        # Client gone (cancelled) or a bug: never leave the upstream request running.
        if resp is not None:
            resp.close()
        raise


class Attempts:
    """The attempts of one request; every slot they took is released by `release()`."""

    __slots__ = (
        "_first_byte",
        "_idle",
        "_slot_of",
        "candidates",
        "ctx",
        "headers_in",
        "hedger",
        "held",
        "max_bytes",
        "max_retry_after_s",
        "observers",
        "priority",
        "retry",
        "slots",
        "started",
    )

    def __init__(
        self,
        ctx: RequestContext,
        headers_in: Mapping[str, str],
        candidates: Sequence[Upstream],
        timeouts: TimeoutsConfig,
        *,
        retry: RetryPolicy,
        observers: Sequence[AttemptObserver] = (),
        slots: SlotGate | None = None,
        hedger: Hedger | None = None,
        max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_retry_after_s: float = 5.0,
    ) -> None:
        self.ctx = ctx
        self.headers_in = headers_in
        self.candidates = candidates
        self._first_byte = timeouts.first_byte
        self._idle = timeouts.idle
        self.retry = retry
        self.observers = observers
        self.slots = slots
        self.hedger = hedger
        self.max_bytes = max_bytes
        # A region asking to wait longer than this is failed over (or its answer returned).
        self.max_retry_after_s = max_retry_after_s
        tenant = ctx.tenant
        self.priority = tenant.priority if tenant is not None else 0
        self.held: list[Slot] = []
        # The slot each answer still holds (what `discard` gives back).
        self._slot_of: dict[Opened, Slot] = {}
        self.started: set[str] = set()
        ctx.candidates = list(candidates)

    async def open(self, upstream: Upstream, body: bytes | None = None) -> Opened:
        """One attempt at `upstream` (the request's body, or another such as a continuation)."""
        ctx = self.ctx
        # Started here, by the attempt loop or beside it (a hedge): no region gets it twice.
        self.started.add(upstream.name)
        slot: Slot | None = None
        if self.slots is not None:
            try:
                slot = await self.slots.acquire(upstream.name, priority=self.priority)
            except Spill as spill:
                # "This region is full here" says nothing of its health; the next region may
                # take it. When none does, this is the answer: 503 overloaded, Retry-After.
                full = self.slots.unavailable(upstream.name, spill.reason)
                full_headers = CIMultiDict({"Content-Type": "application/json", **full.headers})
                raise AttemptError(
                    upstream.name,
                    FailureKind.SPILL,
                    spill.reason,
                    status=full.status,
                    headers=full_headers,
                    body=full.body(),
                    origin=Origin.INTERNAL,
                ) from None
            self.held.append(slot)
            ctx.timer.record(QUEUE, int(slot.wait_s * 1e9))
            ctx.queue_depth = slot.queue_depth
        headers = upstream.request_headers(self.headers_in, ctx.request_id)
        first_byte = self.retry.first_byte(ctx, self._first_byte)
        usage_added = False
        if body is None:
            body = ctx.request.body
            if ctx.meter is not None and upstream.reports_usage and not ctx.request.include_usage:
                # Settle with the region's own numbers, not a count of the text.
                body = with_usage(body)
                usage_added = True
        try:
            opened = await open_attempt(
                upstream, ctx, body, headers, first_byte, self.max_bytes, self._idle
            )
            opened.usage_added = usage_added
            if slot is not None:
                self._slot_of[opened] = slot
            return opened
        except BaseException:
            # This attempt's own slot: with hedging two attempts hold slots at once.
            if slot is not None:
                self.held.remove(slot)
                slot.release()
            raise

    def observe(self, upstream: Upstream, error: AttemptError | None, seconds: float) -> None:
        """Tell every attempt observer how one attempt went; a stream that got its first byte
        is noted open until it breaks or the request's attempts are over (OpenStreams)."""
        ctx = self.ctx
        if error is None and ctx.request.stream:
            ctx.streaming.append((upstream.name, ctx.request.upstream_model, seconds))
        for observer in self.observers:
            observer(ctx, upstream, error, seconds)

    async def first(self) -> Opened:
        """Try the candidates until one answers; raise the last AttemptError if none does.

        Each candidate once, in order; then, when it is the only region serving the model, the
        same region again (at most twice, after a backoff or the region's own Retry-After when
        it fits the client's deadline) if its failure may pass: never after a silence or a
        broken answer. The retry policy gates every attempt after the first.
        """
        ctx = self.ctx
        gate = self.retry.allow
        opener: Opener = self.open
        if self.hedger is not None:
            opener = self.hedger(
                ctx, self.candidates, self.open, self.observers, gate, self.discard
            )
        last: AttemptError | None = None
        tries: dict[str, int] = {}
        failures: dict[str, AttemptError] = {}
        try:
            while True:
                upstream, delay = self._next(tries, failures)
                if upstream is None:
                    break
                if last is not None:
                    ctx.free_retry = last.kind in _FREE or (
                        last.kind == FailureKind.DISCONNECT and upstream.name != last.region
                    )
                if not gate(ctx):
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
                ctx.attempts += 1
                ctx.region = upstream.name
                tries[upstream.name] = tries.get(upstream.name, 0) + 1
                began = time.perf_counter()
                try:
                    opened = await opener(upstream)
                except AttemptError as exc:
                    # The frames it left are done: their locals (a hedge's race holds the tasks
                    # that hold their failures) go now, or it holds itself through them. (Only
                    # finished frames may be in it: clearing a suspended coroutine's frame would
                    # close that coroutine. An opener raises failures it made, never one a
                    # coroutine still running caught and keeps; this frame's own is skipped.)
                    traceback.clear_frames(exc.__traceback__)
                    # A hedge that failed at both regions raises the failure of one of them.
                    failed = self._named(exc.region, upstream)
                    self.observe(failed, exc, time.perf_counter() - began)
                    ctx.last_failure = exc.kind
                    if exc.kind == FailureKind.SPILL:
                        ctx.spills += 1  # no region saw it: not one of max_attempts
                    # (Not for a 503: regions behind one ingress send the same page while
                    # shedding.)
                    repeated = (
                        last is not None
                        and exc.kind == last.kind == FailureKind.STATUS
                        and exc.status == last.status
                        and exc.status != _SHEDDING
                        and exc.body == last.body
                        and exc.region != last.region
                    )
                    last = failures[failed.name] = exc
                    if not exc.retryable or repeated:
                        # Two regions with the same answer: the request, not the region,
                        # decides it.
                        break
                    log.warning(
                        "request %s: attempt %d failed: %s", ctx.request_id, ctx.attempts, exc
                    )
                    continue
                # opened.upstream: a hedged attempt may have been won by another region.
                self.observe(opened.upstream, None, time.perf_counter() - began)
                return opened
            if last is None:
                raise AttemptError(
                    "-", FailureKind.CONNECT, "no candidate regions", retryable=False
                )
            raise last
        finally:
            # The failures' tracebacks hold this frame, which held them: a cycle per failed
            # attempt (holding the request's objects) for the collector. Let go of them here.
            last = None
            failures.clear()

    def _named(self, name: str, default: Upstream) -> Upstream:
        """The candidate called `name` (`default` when none is)."""
        if name == default.name:
            return default
        return next((u for u in self.candidates if u.name == name), default)

    def _next(
        self, tries: dict[str, int], failures: dict[str, AttemptError]
    ) -> tuple[Upstream | None, float]:
        """The next region to try and how long to wait first (None: nothing left to try)."""
        for upstream in self.candidates:
            if upstream.name not in self.started:
                return upstream, 0.0
        if len(self.candidates) > 1:
            # Another region serves the model: its failure is the answer, not a reason to wait.
            return None, 0.0
        deadline = self.ctx.deadline
        now = time.monotonic()
        for upstream in self.candidates:
            failure = failures.get(upstream.name)
            count = tries.get(upstream.name, 0)
            if failure is None or not failure.same_region or count >= _PER_REGION:
                continue
            delay = _BACKOFF_S * (2 ** (count - 1)) * random.uniform(0.5, 1.5)
            if failure.retry_after_s is not None:
                if failure.retry_after_s > self.max_retry_after_s:
                    continue
                delay = max(delay, failure.retry_after_s)
            if deadline is not None and now + delay >= deadline:
                continue
            return upstream, delay
        return None, 0.0

    async def again(self, upstream: Upstream, body: bytes) -> Opened:
        """A further attempt after bytes reached the client (a continuation), counted and
        observed like any other. The attempts before it have ended (the stream broke): their
        admission slots are given back first."""
        self.release()
        ctx = self.ctx
        ctx.attempts += 1
        began = time.perf_counter()
        try:
            opened = await self.open(upstream, body)
        except AttemptError as exc:
            self.observe(upstream, exc, time.perf_counter() - began)
            raise
        self.observe(upstream, None, time.perf_counter() - began)
        return opened

    def discard(self, opened: Opened) -> None:
        """Let go of an answer nobody will use (a hedge's loser, in the same turn as the
        winner's): its request closed, so the region stops and its pooled connection is not
        held by a response nobody reads, and its admission slot given back now."""
        if opened.response is not None:
            opened.response.close()
        slot = self._slot_of.pop(opened, None)
        if slot is not None and slot in self.held:
            self.held.remove(slot)
            slot.release()

    def release(self) -> None:
        """Give back every admission slot the attempts still hold."""
        held, self.held = self.held, []
        self._slot_of.clear()
        for slot in held:
            slot.release()
