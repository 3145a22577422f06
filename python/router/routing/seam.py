"""The seam of a continued stream: what the client was sent, and holding a new stream back
until it passed that (routing.continuation for chat, routing.event_continuation for the
typed-event APIs)."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from router.access.usage import length_bound
from router.core.context import RequestContext, UsageMeter
from router.core.failure import AttemptError
from router.core.stream import (
    DEFAULT_MAX_EVENT_BYTES,
    DONE_EVENT,
    EventState,
    StreamState,
    json_object,
    kept_usage,
    passable,
)
from router.core.upstream import Opened, Upstream
from router.errors import InvalidRequest
from router.net import http1, sse
from router.net.idle import IdleWatch

log = logging.getLogger("router")


def cap_cached(usage: dict[str, Any], tokens: str, details: str) -> None:
    """A rewritten usage's cached prompt tokens, at most its prompt tokens: a continuation's
    cache covered the prefill too, which the rewrite moved to the completion."""
    held = usage.get(details)
    prompt = usage.get(tokens)
    if isinstance(held, dict) and isinstance(prompt, int):
        cached = held.get("cached_tokens")
        if isinstance(cached, int) and cached > prompt:
            held["cached_tokens"] = prompt


class SentEvents:
    """Passes on whole SSE events only, and notes (`_note`) what each carried once sent."""

    __slots__ = (
        "_decoder",
        "_sent",
        "done",
        "events",
        "first",
        "pieces",
        "prompt",
        "tail",
        "unsupported",
    )

    def __init__(self) -> None:
        self.tail = b""
        self.pieces: list[str] = []
        # Content events seen: how many tokens the client already has.
        self.events = 0
        self.done = False
        # The client got something a prefill cannot carry on (a tool call, reasoning): the
        # stream is not continued.
        self.unsupported = False
        # How the region that streamed treated the client's own prefill; decided at the first
        # break.
        self.first: FirstStream | None = None
        # The prompt tokens a region reported in the stream (the first region's own count,
        # when it gave one before it broke).
        self.prompt: int | None = None
        self._decoder = sse.Decoder()
        self._sent = b""

    def flush(self) -> bytes:
        """Whatever is held back, at the end of a clean stream."""
        self.settle()
        out, self.tail = self.tail, b""
        return out

    @property
    def text(self) -> str:
        """The assistant text streamed so far."""
        return "".join(self.pieces)

    def feed(self, chunk: bytes) -> bytes:
        """The complete events in tail + chunk (to send now); the rest waits for more bytes.

        What they carry is read by `settle()`, once the caller has sent them: parsing them
        first would delay every token by the parse.
        """
        self.settle()
        data = self.tail + chunk
        cut = sse.last_boundary(data)
        out, self.tail = data[:cut], data[cut:]
        self._sent = out
        return out

    def settle(self) -> None:
        """Note what the events the last feed() passed on carried."""
        sent, self._sent = self._sent, b""
        if sent:
            for payload in self._decoder.feed(sent):
                self._note(payload)

    def _note(self, payload: bytes) -> None:
        raise NotImplementedError


# Content parts that are plain text, in chat, Responses and Messages requests.
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def _is_text(kind: object) -> bool:
    """Whether a content part's `type` (anything a client sent) names a text part."""
    return isinstance(kind, str) and kind in _TEXT_PARTS


def _text_of(content: object) -> str | None:
    """A message's content as one string; None if it holds anything but text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    pieces = []
    for part in content:
        if not isinstance(part, dict) or not _is_text(part.get("type")):
            return None
        text = part.get("text")
        if not isinstance(text, str):
            return None
        pieces.append(text)
    return "".join(pieces)


@dataclass(frozen=True, slots=True)
class FirstStream:
    """How the region that streamed treated the request's trailing assistant message (the
    client's own prefill), if there was one: continued it (`extends`), or answered it with a
    turn of its own; whether it may have sent it back first (`echoed`, llama-server); and
    whether it read llama.cpp's `n_predict` before the API's length fields (`n_predict`)."""

    extends: bool = False
    echoed: bool = False
    n_predict: bool = False


# A region that answers a trailing assistant message with a turn of its own.
NEW_TURN = FirstStream()


def with_prefill(
    messages: list[Any],
    sent: str,
    first: FirstStream,
    shape: dict[str, Any] | None = None,
) -> tuple[list[Any], str] | None:
    """`messages` ending in the assistant text the client has (a prefill to continue), and that
    message's whole text, which a region may answer back first.

    A client's prefill that the first region continued is extended, never followed by a second
    assistant turn: its text comes first, unless that region sent it back (`echoed`, believed
    only when the client's text begins with it). One the region answered with a turn of its own
    stays a turn of its own. None when the stream cannot be carried on: the prefill holds
    anything but text (or tool calls), or the stream broke inside the prefill's echo. A new
    message gets the fields of `shape` too.
    """
    last = messages[-1] if messages else None
    if not first.extends or not isinstance(last, dict) or last.get("role") != "assistant":
        return [*messages, {**(shape or {}), "role": "assistant", "content": sent}], sent
    content = last.get("content")
    prior = "" if content is None else _text_of(content)
    if prior is None or last.get("tool_calls"):
        return None
    if first.echoed and sent.startswith(prior):
        whole = sent
    elif first.echoed and prior.startswith(sent):
        return None  # cut inside the echo: the client lacks part of a prefill it never asked for
    else:
        whole = prior + sent
    return [*messages[:-1], {**last, "content": whole}], whole


# Every field some region reads as the answer's length (llama.cpp's server reads `n_predict`
# first, then the others as aliases of it).
_LENGTH_FIELDS = ("n_predict", "max_completion_tokens", "max_tokens", "max_output_tokens")


def lower_limits(
    fields: dict[str, Any], body: bytes, endpoint: str, first: FirstStream, sent: int
) -> bool:
    """Lower the length fields of a continuation's request (`fields`, decoded from `body`) to
    what the client's request allowed, as the region that streamed read it, less the `sent`
    tokens the client has: every length field the request carried gets that number, so the
    next region stops where the first would have, whichever field it reads. Unbounded (no
    field, or llama.cpp's negative `n_predict`): left as they are. False when a length field
    cannot be read as a whole number (access.usage.length_bound): how far the continuation may
    go is unknown, so it must not be sent."""
    try:
        bound = length_bound(body, endpoint, first.n_predict)
    except InvalidRequest:
        return False
    if bound is None:
        return True
    # At least one: with nothing left the stream is ended, not continued
    # (continuation.MidstreamPolicy.resume).
    left = max(1, bound - sent)
    for key in _LENGTH_FIELDS:
        if fields.get(key) is not None:
            fields[key] = left
    return True


# The stop strings checked at a seam: the first 16 (OpenAI's allow 4), each of at most 1024
# characters, bounding the work a request's stop strings can cost the router.
MAX_SEAM_STOPS = 16
MAX_SEAM_STOP_CHARS = 1024


class _Stops(msgspec.Struct):
    stop: Any = None
    stop_sequences: Any = None
    messages: Any = None


_STOPS = msgspec.json.Decoder(_Stops)


class SeamStop:
    """Where a stop string of the request begun by the text the client has completes in a
    continuation: the region continuing matches stop strings in its own text only, so it never
    finds one across the seam. (vLLM and llama.cpp hold back text that may begin a stop string,
    so after them the client's text never ends inside one; a server that sends it as it comes
    leaves that to the router.) The continuation's first text is held back while it may still
    complete one."""

    __slots__ = ("held", "matched", "needs")

    def __init__(self, needs: list[tuple[str, str]]) -> None:
        # (the rest, the stop string) of each stop string that the client's text ends with the
        # start of, the shortest rest (so completing first) first.
        self.needs = sorted(needs, key=lambda need: len(need[0]))
        self.held = ""
        # The stop string that completed.
        self.matched = ""

    def take(self, piece: str) -> bool | None:
        """True: `piece` completes a stop string begun before the seam (the answer ends there,
        none of it sent); None: hold it back, it still may; False: it cannot, send what was
        held and it (the seam is passed)."""
        seen = self.held + piece
        for rest, stop in self.needs:
            if seen.startswith(rest):
                self.matched = stop
                return True
        # Only those the text so far begins stay possible.
        self.needs = [need for need in self.needs if need[0].startswith(seen)]
        if self.needs:
            self.held = seen
            return None
        return False


def seam_stop(body: bytes, sent: str, first: FirstStream) -> SeamStop | None:
    """The SeamStop for a continuation of `sent`, the text the client has, under the request's
    `stop` (a string or a list of them) or Messages' `stop_sequences`; None when the client's
    text ends in no stop string's start. Only the text the region generated counts: a client's
    own prefill that the first region answered back (`first.echoed`) is no part of it, as no
    server matches stop strings in the prompt."""
    try:
        fields = _STOPS.decode(body)
    except msgspec.MsgspecError:
        return None
    stops: list[Any] = []
    for field in (fields.stop, fields.stop_sequences):
        stops += [field] if isinstance(field, str) else field if isinstance(field, list) else []
    messages = fields.messages
    last = messages[-1] if isinstance(messages, list) and messages else None
    if (
        first.extends
        and first.echoed
        and isinstance(last, dict)
        and last.get("role") == "assistant"
    ):
        prior = _text_of(last.get("content")) or ""
        if sent.startswith(prior):
            sent = sent[len(prior) :]
    needs = [
        (stop[cut:], stop)
        for stop in stops[:MAX_SEAM_STOPS]
        if isinstance(stop, str) and len(stop) <= MAX_SEAM_STOP_CHARS
        for cut in range(1, len(stop))
        if sent.endswith(stop[:cut])
    ]
    return SeamStop(needs) if needs else None


class Diverged(Exception):
    """A regenerated answer does not start with the text the client already has."""


class Catchup:
    """Holds a stream's text back until it has passed the text the client has: a regenerated
    answer must repeat it exactly; a continuation may echo it first (llama-server returns the
    prefill with the new text), or not (`echo`: then whatever it says is new)."""

    __slots__ = ("echo", "have", "seen", "through")

    def __init__(self, have: str, *, echo: bool = False) -> None:
        self.have = have
        self.echo = echo
        self.seen = ""
        self.through = not have

    def take(self, piece: str) -> str | None:
        """The new text in `piece` (None: held back, the client has it); _Diverged if the new
        answer is not the old one continued."""
        if self.through:
            return piece
        seen = self.seen + piece
        if len(seen) <= len(self.have) and self.have.startswith(seen):
            self.seen = seen
            self.through = seen == self.have
            return None
        self.through = True
        if seen.startswith(self.have):
            return seen[len(self.have) :]
        if self.echo:
            return seen  # no echo after all: all of it is new
        raise Diverged("the regenerated text differs")

    def ended(self) -> None:
        """The stream finished: within an echo of the text (or at once) is fine; a regenerated
        answer that never reached the text is _Diverged."""
        if self.through:
            return
        if not self.echo:
            raise Diverged("ended before reaching the text already sent")
        self.through = True


class Stitch(Protocol):
    """Turns a continuation's events into the first stream's (per API)."""

    @property
    def through(self) -> bool:
        """The continuation passed the text the client had."""

    @property
    def ended(self) -> bool:
        """The stitch ended the answer itself (a stop string completed across the seam, its
        end sent): nothing more of the continuation is read."""

    def event(self, event: bytes) -> bytes | None:
        """One whole event of the continuation as the client gets it; None to drop it."""


async def carry_on(
    ctx: RequestContext,
    upstream: Upstream,
    body: bytes,
    open_one: Callable[[Upstream, bytes], Awaitable[Opened]],
    write: Callable[[bytes], Awaitable[None]],
    tracker: SentEvents,
    idle_s: float,
    state: StreamState | EventState,
    stitch: Stitch,
    max_bytes: float = math.inf,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> bool | None:
    """Stream the continuation from `upstream` to `write`, each event through `stitch`: True
    once it finished, False if it broke or diverged, None if the attempt itself failed (or
    passed timeouts.total). The usage it reports (rewritten by `stitch` to cover the whole
    answer) is the request's (`ctx.reported`)."""
    try:
        opened = await open_one(upstream, body)
    except AttemptError as exc:
        log.warning(
            "request %s: resume on %s failed: %s%s",
            ctx.request_id,
            upstream.name,
            exc,
            f" {exc.body[:500]!r}" if exc.body else "",
        )
        return None
    resp = opened.response
    if resp is None:
        # The region refused the continuation (e.g. a prefill it does not take): say how.
        log.warning(
            "request %s: resume on %s refused: HTTP %d %r",
            ctx.request_id,
            upstream.name,
            opened.status,
            (opened.body or b"")[:500],
        )
        return False
    splitter = sse.Splitter(max_event_bytes)
    complete = False
    scrub = upstream.scrub if upstream.has_secret else None

    async def carry(raw: list[bytes]) -> None:
        events = []
        data = passable(raw, state, False)
        if scrub is not None and data:
            data = scrub(data)
        for event in sse.split_events(data):
            kept = stitch.event(event + b"\n\n")
            if kept is not None:
                events.append(kept)
                if b'"usage"' in kept:
                    _note_usage(ctx, kept)
        if events:
            await _write(write, b"".join(events), tracker, ctx.meter)

    size = 0
    try:
        chunk = opened.first
        async with IdleWatch(idle_s) as idle:
            while chunk:
                size += len(chunk)
                if size > max_bytes:
                    left = f"the {int(max_bytes)} bytes left of server.max_response_bytes"
                    raise sse.EventTooLarge(f"the answer passed {left}")
                await carry(splitter.feed(chunk))
                if state.error is not None or stitch.ended:
                    break  # the region's error event, or the router's end: the stream ends
                idle.waiting()
                chunk = await resp.content.readany()
                idle.busy()
        if stitch.ended:
            return True
        if splitter.pending and state.error is None:
            # Its last event, only the blank line missing (`data: [DONE]\n`).
            await carry(splitter.end())
        # Bytes left after a finished stream (a stray newline) cut nothing.
        complete = state.complete and stitch.through
        if complete and state.owes_done:
            # Through the stitch: what it owes before the end (a usage event) goes first.
            done = stitch.event(DONE_EVENT) or DONE_EVENT
            _note_usage(ctx, done)
            await _write(write, done, tracker, ctx.meter)
        return complete
    except http1.TotalDeadline:
        # The router's own bound on one exchange (a slow client holds it): not the region's.
        log.warning("request %s: resume on %s passed timeouts.total", ctx.request_id, upstream.name)
        return None
    except (http1.ClientError, TimeoutError, sse.EventTooLarge, Diverged) as exc:
        log.warning("request %s: resume on %s failed: %s", ctx.request_id, upstream.name, exc)
        return False
    finally:
        if complete:
            resp.release()
        else:
            resp.close()


def _note_usage(ctx: RequestContext, events: bytes) -> None:
    """Usage events the client got from a continuation (`events`: whole events, a stitch may
    make two of one): what the request reported (chat and Messages events carry `usage`,
    Responses ones `response.usage`; a null one is none)."""
    for event in sse.split_events(events):
        if b'"usage"' not in event:
            continue
        payload = sse.data_of(event)
        obj = json_object(payload) if payload is not None else None
        if obj is None or payload is None:
            continue
        response = obj.get("response")
        usage = obj.get("usage") or (response.get("usage") if isinstance(response, dict) else None)
        if isinstance(usage, dict):
            kept_usage(ctx.reported, payload)


async def written(
    ctx: RequestContext,
    write: Callable[[bytes], Awaitable[None]],
    tracker: SentEvents,
    events: bytes,
) -> None:
    """Send the router's own end of a stream (whole events) as a continuation's would go: its
    usage the request's, through the tracker and the meter."""
    _note_usage(ctx, events)
    await _write(write, events, tracker, ctx.meter)


async def _write(
    write: Callable[[bytes], Awaitable[None]],
    data: bytes,
    tracker: SentEvents,
    meter: UsageMeter | None,
) -> None:
    # Through the tracker so a second break resumes from the right text; through the meter
    # so the key is charged for the continuation too.
    tracker.feed(data)
    if meter is not None:
        meter.feed(data)
    await write(data)
    tracker.settle()
