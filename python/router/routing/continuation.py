"""Mid-stream resume: continue a broken chat or completions stream on another region from the
text already sent.

The relay hands complete SSE events only to the client (`StreamTracker`), so a break never
leaves half an event behind. On a break the text streamed so far goes to the next region as an
assistant prefill (completions: after the prompt); its stream is relayed minus the role
preamble, with the first stream's id, so the client sees one stream with nothing duplicated or
lost.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from router.access.usage import length_bound
from router.config import RegionConfig, RoutingConfig
from router.core.context import RequestContext
from router.core.request import CHAT, COMPLETIONS, MESSAGES, whole_number
from router.core.sampling import sampled_anyway
from router.core.stream import EventState, StreamState, json_object
from router.core.upstream import Opened, Upstream
from router.errors import InvalidRequest
from router.net import sse
from router.routing import event_continuation
from router.routing.event_continuation import EventTracker
from router.routing.seam import (
    NEW_TURN,
    Catchup,
    FirstStream,
    SeamStop,
    SentEvents,
    Stitch,
    cap_cached,
    carry_on,
    lower_limits,
    seam_stop,
    with_prefill,
    written,
)

log = logging.getLogger("router")

_DECODE = msgspec.json.Decoder()
_ENCODE = msgspec.json.Encoder()
_DONE = b"[DONE]"
# Kinds that continue a trailing assistant message on every API (llama-server; the sim stands
# for it); others only on the Messages API (Anthropic's semantics) or a chat request with
# `continue_final_message` (vLLM's switch), and answer it with a new turn otherwise.
_CONTINUES_PREFILL = frozenset({"llama-server", "sim"})
# Kinds that may answer a prefill back before the new text (llama-server does; "sim" and
# "generic" may stand for it). Whether one did is read from the text the client got.
_MAY_ECHO = frozenset({"llama-server", "sim", "generic"})
# Kinds that read llama.cpp's `n_predict` before the API's length fields (the sim stands for
# llama-server).
_READS_N_PREDICT = frozenset({"llama-server", "sim"})
# Chat delta fields a prefill (an assistant message's text) cannot carry on: a tool call (or
# the legacy function call), reasoning (`reasoning_content`: llama-server's and vLLM's;
# `reasoning`: vLLM's newer name), audio, a refusal. A stream that sent any is not continued.
_NOT_TEXT = ("tool_calls", "function_call", "reasoning_content", "reasoning", "audio", "refusal")


def _piece_of(choice: object, completions: bool) -> tuple[dict[str, Any] | None, str]:
    """Where a chunk's choice holds its text: (the dict, its key); chat: `delta.content`,
    completions: `text`."""
    if not isinstance(choice, dict):
        return None, ""
    if completions:
        return choice, "text"
    delta = choice.get("delta")
    return (delta if isinstance(delta, dict) else None), "content"


class StreamTracker(SentEvents):
    """SentEvents of a chat (or `completions`) stream: its text, and the id / created / model
    of its chunks; `unsupported` once a chunk carried anything but text (_NOT_TEXT)."""

    __slots__ = ("completions", "ident")

    def __init__(self, *, completions: bool = False) -> None:
        super().__init__()
        self.completions = completions
        # id / created / model of the first stream, stamped on resumed events.
        self.ident: dict[str, Any] = {}

    def _note(self, payload: bytes) -> None:
        if payload == _DONE:
            self.done = True
            return
        obj = json_object(payload)
        if obj is None:
            return
        if not self.ident:
            self.ident = {k: obj[k] for k in ("id", "created", "model") if k in obj}
        usage = obj.get("usage")
        if isinstance(usage, dict):
            prompt = usage.get("prompt_tokens")
            if isinstance(prompt, int) and not isinstance(prompt, bool):
                self.prompt = prompt
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            holder, key = _piece_of(choice, self.completions)
            if holder is not None:
                piece = holder.get(key)
                if isinstance(piece, str) and piece:
                    self.pieces.append(piece)
                    self.events += 1
                if not self.completions and any(holder.get(k) for k in _NOT_TEXT):
                    self.unsupported = True


def continuation_body(
    body: bytes,
    sent: str,
    tokens_sent: int,
    kind: str = "vllm",
    first: FirstStream = NEW_TURN,
) -> tuple[bytes, str] | None:
    """The chat request again, ending in an assistant message with the text the client has
    (`sent`, after the client's own prefill if any: seam.with_prefill), its length limits
    lowered by the `tokens_sent` (seam.lower_limits); and that message's text. None if it
    cannot be continued (a prefill of more than text, a length field that cannot be read)."""
    fields = _DECODE.decode(body)
    prefilled = with_prefill(list(fields.get("messages") or []), sent, first)
    if prefilled is None:
        return None
    fields["messages"], prefill = prefilled
    if not lower_limits(fields, body, CHAT, first, tokens_sent):
        return None
    if kind != "llama-server":
        # vLLM continues the last assistant message instead of opening a new turn with these;
        # llama-server continues a trailing assistant message by itself.
        fields["continue_final_message"] = True
        fields["add_generation_prompt"] = False
    return _ENCODE.encode(fields), prefill


def _one(value: object, param: str) -> bool:
    """Whether a choices field asks for one (unset, or 1 as a server reads a whole number:
    core.request.whole_number); one it cannot read is not taken for one."""
    try:
        return whole_number(value, param, minimum=1) in (None, 1)
    except InvalidRequest:
        return False


def _one_choice(decoded: Any) -> bool:
    """Whether a request asks for one answer: no `n`, `best_of` or llama.cpp's `n_cmpl` (read
    before `n` there) other than 1; several choices' text is no one prefill."""
    return all(_one(getattr(decoded, name, None), name) for name in ("n", "best_of", "n_cmpl"))


def resumable_chat(decoded: Any) -> bool:
    """Whether a chat stream can be carried on (`decoded`: the request as the request stage
    read it): one choice (the text so far is one answer's)."""
    return _one_choice(decoded)


def resumable_completion(decoded: Any) -> bool:
    """Whether a completions stream can be carried on: one text prompt, one choice, no echo."""
    return (
        isinstance(getattr(decoded, "prompt", None), str)
        and getattr(decoded, "echo", None) in (None, False)
        and _one_choice(decoded)
    )


def completion_body(
    body: bytes, sent: str, tokens_sent: int, first: FirstStream = NEW_TURN
) -> bytes | None:
    """The completions request again, its prompt followed by the text the client has (which the
    region carries on, as it would its own), its length limits less what was sent
    (seam.lower_limits: as the region that streamed read them); None if a length field cannot
    be read."""
    fields = _DECODE.decode(body)
    fields["prompt"] = fields["prompt"] + sent
    if not lower_limits(fields, body, COMPLETIONS, first, tokens_sent):
        return None
    return _ENCODE.encode(fields)


def restamp(event: bytes, ident: dict[str, Any]) -> bytes | None:
    """A resumed stream's event as part of the first stream; None for its role preamble."""
    payload = sse.data_of(event)
    if payload is None or payload == _DONE:
        return event
    obj = json_object(payload)
    if obj is None:
        return event
    choices = obj.get("choices") or []
    if (
        len(choices) == 1
        and isinstance(choices[0], dict)
        and (choices[0].get("delta") or {}).get("role")
        and not (choices[0].get("delta") or {}).get("content")
        and choices[0].get("finish_reason") is None
    ):
        return None
    obj.update(ident)
    return b"data: " + _ENCODE.encode(obj)


# What each server kind can do with a cut stream ([[regions]] kind, continuation = "auto"):
# chat, and the Responses / Messages APIs (a trailing assistant message continued, checked on
# llama-server; vLLM's handling of one there is not known, so it regenerates).
_CONTINUES = frozenset({"vllm", "llama-server", "sim"})
_CONTINUES_EVENTS = frozenset({"llama-server", "sim"})


def mode_of(config: RegionConfig, *, events: bool = False) -> str:
    """How a region can carry on a cut stream (`events`: of the typed-event APIs): continue,
    regenerate or none."""
    if config.continuation != "auto":
        return config.continuation
    return (
        "continue" if config.kind in (_CONTINUES_EVENTS if events else _CONTINUES) else "regenerate"
    )


class _Flags(msgspec.Struct):
    continue_final_message: Any = None


_FLAGS = msgspec.json.Decoder(_Flags)


def first_stream(kind: str, endpoint: str, body: bytes) -> FirstStream:
    """How a region of `kind` treats the request: its trailing assistant message, if it has
    one (continues it, or answers it with a turn of its own; whether it may send it back first:
    vLLM's Messages API is said to, like llama-server), and its length fields."""
    if endpoint == MESSAGES or kind in _CONTINUES_PREFILL:
        extends = True
    elif endpoint == CHAT:
        try:
            extends = _FLAGS.decode(body).continue_final_message is True
        except msgspec.MsgspecError:
            extends = False
    else:
        extends = False
    echoed = kind in _MAY_ECHO or (endpoint == MESSAGES and kind == "vllm")
    return FirstStream(extends, echoed, kind in _READS_N_PREDICT)


class _Sampling(msgspec.Struct):
    temperature: float | None = None
    seed: int | None = None
    # llama.cpp's server's dynamic temperature and sampler chain: with a range, or a chain
    # without the temperature sampler, it samples at temperature 0 too (core.sampling).
    dynatemp_range: Any = None
    samplers: Any = None
    # Its XTC sampler, which draws before the temperature sampler.
    xtc_probability: Any = None
    xtc_threshold: Any = None


_SAMPLING = msgspec.json.Decoder(_Sampling)


def deterministic(body: bytes) -> bool:
    """Whether the same request gives the same text again: temperature 0 (that llama.cpp's
    server applies: no dynamic temperature range, no sampler chain without it, no XTC before
    it), or a seed."""
    try:
        sampling = _SAMPLING.decode(body)
    except msgspec.MsgspecError:
        return False
    greedy = sampling.temperature == 0 and not sampled_anyway(
        sampling.dynatemp_range,
        sampling.samplers,
        sampling.xtc_probability,
        sampling.xtc_threshold,
    )
    return greedy or sampling.seed is not None


def whole_usage(event: bytes, sent: int, prompt: int | None = None) -> bytes:
    """A continuation's usage event rewritten to cover the whole answer: the `sent` tokens the
    client already had were part of the continuation's prompt (the prefill), and are part of
    the answer's completion. Its prompt is the request's own (`prompt`: the first region's
    report, else the router's exact count); unknown, the continuation's less `sent` (close:
    the prefill re-tokenised need not be `sent` tokens long)."""
    payload = sse.data_of(event)
    if payload is None or b'"usage"' not in payload:
        return event
    obj = json_object(payload)
    usage = obj.get("usage") if obj is not None else None
    if obj is None or not isinstance(usage, dict):
        return event
    said, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(said, int) or not isinstance(completion, int):
        return event
    usage["prompt_tokens"] = prompt if prompt is not None else max(0, said - sent)
    usage["completion_tokens"] = completion + sent
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    cap_cached(usage, "prompt_tokens", "prompt_tokens_details")
    return b"data: " + _ENCODE.encode(obj) + b"\n\n"


class MidstreamPolicy:
    """What the relay does when a stream breaks: report it (`report(ctx, region)`: a failure of
    that region, core.open_streams.OpenStreams.broke), then continue elsewhere or give up.

    A region continues only in the way it can (`mode_of`): "continue" sends the text so far as
    an assistant prefill; "regenerate" resends the request (deterministic requests only) and
    holds its output back until it has passed, and matched, what the client already has.
    """

    def __init__(
        self,
        mode: str,
        *,
        max_resumes: int,
        report: Callable[[RequestContext, str], None],
        count_prompt: Callable[[RequestContext, bool], int | None] | None = None,
    ) -> None:
        self.mode = mode
        self.max_resumes = max_resumes
        self.report = report
        # The router's count of a request's prompt tokens (the limiter's: the model's own
        # tokenizer when [tokenizers] has it, else an estimate; asked for an exact one, None
        # without it), for the usage of a continued answer when the first region reported
        # none before it broke.
        self.count_prompt = count_prompt

    def retune(self, routing: RoutingConfig) -> None:
        """A reloaded [routing] section."""
        self.mode = routing.midstream
        self.max_resumes = routing.max_resumes

    def track(self, ctx: RequestContext) -> SentEvents | None:
        """A tracker for a stream that may be resumed; None when it never will be: chat of one
        choice, completions of one text prompt (one choice, no echo), and Responses / Messages
        streams whose state no other region has."""
        if self.mode != "resume" or self.max_resumes == 0:
            return None
        tracker: SentEvents
        if ctx.endpoint == CHAT and resumable_chat(ctx.request.decoded):
            tracker = StreamTracker()
        elif ctx.endpoint == COMPLETIONS and resumable_completion(ctx.request.decoded):
            tracker = StreamTracker(completions=True)
        elif ctx.dialect.events and not ctx.request.stateful:
            tracker = EventTracker()
        else:
            return None
        ctx.tracker = tracker
        return tracker

    async def resume(
        self,
        ctx: RequestContext,
        write: Callable[[bytes], Awaitable[None]],
        open_one: Callable[[Upstream, bytes], Awaitable[Opened]],
        reason: str,
        idle_s: float,
        max_bytes: float = math.inf,
    ) -> bool:
        """Continue ctx's broken stream on the remaining candidates, each allowed `idle_s`
        between chunks (the request's `timeouts.idle`) and `max_bytes` from its region (what
        is left of `server.max_response_bytes`); False if none could."""
        tracker = ctx.tracker
        if isinstance(tracker, SentEvents):
            tracker.settle()
            if tracker.done:
                return False  # the client has the region's end: nothing broke
        if ctx.region is not None:
            # Its first byte did not count as a success yet: the break counts as a failure.
            self.report(ctx, ctx.region)
        if not isinstance(tracker, SentEvents) or tracker.unsupported:
            return False
        again = deterministic(ctx.request.body)
        if tracker.first is None:
            streamed = next((u for u in ctx.candidates if u.name == ctx.region), None)
            kind = streamed.config.kind if streamed is not None else "generic"
            tracker.first = first_stream(kind, ctx.endpoint, ctx.request.body)
        first = tracker.first
        try:
            bound = length_bound(ctx.request.body, ctx.endpoint, first.n_predict)
        except InvalidRequest:
            # How far the first region would have gone is unknown (a length the router
            # cannot read as a whole number, `n_predict: 7.5`): a continuation might pass it.
            log.warning("request %s: not resumed: its length cannot be read", ctx.request_id)
            return False
        # The request's prompt tokens: the first region's own count, else the router's exact
        # one; and, for a usage block made from nothing, the router's estimate at worst.
        prompt = counted = tracker.prompt
        if prompt is None and self.count_prompt is not None:
            prompt = counted = self.count_prompt(ctx, True)
            if counted is None:
                counted = self.count_prompt(ctx, False)
        if bound is not None and tracker.events >= bound:
            # Cut after the last token allowed, before the region said so: nothing is left to
            # ask for. The stream ends as the region's would have at its length limit.
            if isinstance(tracker, EventTracker):
                end = event_continuation.length_end(tracker, ctx.dialect.anthropic, counted)
            else:
                assert isinstance(tracker, StreamTracker)
                end = length_end(tracker, ctx.request.include_usage, counted)
            await written(ctx, write, tracker, end)
            return True
        tried = 0
        for upstream in ctx.candidates:
            if tried >= self.max_resumes or upstream.name == ctx.region:
                continue
            mode = mode_of(upstream.config, events=isinstance(tracker, EventTracker))
            if mode == "none" or (mode == "regenerate" and not again):
                continue
            body = ctx.request.body
            # What the new region is asked to continue, and may answer back first.
            prefill: str | None = None
            if mode == "continue" and isinstance(tracker, StreamTracker) and tracker.completions:
                # The prompt carries on with the text: whatever the region says is new.
                extended = completion_body(body, tracker.text, tracker.events, first)
                if extended is None:
                    continue
                body, prefill = extended, ""
            elif mode == "continue":
                made = (
                    event_continuation.continuation_body(
                        body, tracker.text, tracker.events, ctx.dialect.anthropic, first
                    )
                    if isinstance(tracker, EventTracker)
                    else continuation_body(
                        body, tracker.text, tracker.events, upstream.config.kind, first
                    )
                )
                if made is None:
                    # The client's own prefill holds more than text: nothing to extend.
                    continue
                body, prefill = made
            tried += 1
            log.warning(
                "request %s: %s on %s after %d tokens (%s)",
                ctx.request_id,
                "resuming" if mode == "continue" else "regenerating",
                upstream.name,
                tracker.events,
                reason,
            )
            state: StreamState | EventState
            stitch: Stitch
            if isinstance(tracker, EventTracker):
                state = EventState(ctx.dialect.terminal)
                # Messages' stop sequences checked at the seam (the Responses API has none).
                seam = ctx.dialect.anthropic and prefill is not None
                stitch = event_continuation.Stitcher(
                    tracker,
                    prefill=prefill,
                    prompt=prompt,
                    seam=seam_stop(ctx.request.body, tracker.text, first) if seam else None,
                )
            else:
                assert isinstance(tracker, StreamTracker)
                state = StreamState()
                stitch = ChatStitch(
                    tracker,
                    prefill=prefill,
                    prompt=prompt,
                    counted=counted,
                    usage=ctx.request.include_usage,
                    seam=(
                        None
                        if prefill is None
                        else seam_stop(ctx.request.body, tracker.text, first)
                    ),
                )
            ok = await carry_on(
                ctx, upstream, body, open_one, write, tracker, idle_s, state, stitch, max_bytes
            )
            if ok:
                ctx.region = upstream.name
                return True
            if ok is False:
                # It answered and then broke (a failed attempt was reported by the attempt path).
                self.report(ctx, upstream.name)
        return False


class _Catchup(Catchup):
    """Catchup over OpenAI chat (or `completions`) chunks."""

    __slots__ = ("completions",)

    def __init__(self, have: str, *, echo: bool = False, completions: bool = False) -> None:
        super().__init__(have, echo=echo)
        self.completions = completions

    def event(self, event: bytes) -> bytes | None:
        """The event to relay (its new text only), None to hold it back."""
        if self.through:
            return event
        payload = sse.data_of(event)
        obj = json_object(payload) if payload is not None and payload != _DONE else None
        choices = obj.get("choices") if obj is not None else None
        if obj is None or not isinstance(choices, list) or len(choices) != 1:
            return None
        choice = choices[0]
        holder, key = _piece_of(choice, self.completions)
        piece = holder.get(key) if holder is not None else None
        if not isinstance(piece, str) or not piece:
            if isinstance(choice, dict) and choice.get("finish_reason") is not None:
                self.ended()
                return event
            return None
        text = self.take(piece)
        if text is None:
            return None
        if holder is not None:
            holder[key] = text
        return b"data: " + _ENCODE.encode(obj) + b"\n\n"


def _usage_event(tracker: StreamTracker, prompt: int, chunks: int) -> bytes:
    """A usage chunk of the first stream's: `prompt` tokens, a completion of `chunks`."""
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": chunks,
        "total_tokens": prompt + chunks,
    }
    kind = "text_completion" if tracker.completions else "chat.completion.chunk"
    obj = {**tracker.ident, "object": kind, "choices": [], "usage": usage}
    return b"data: " + _ENCODE.encode(obj) + b"\n\n"


def _finish_event(tracker: StreamTracker, reason: str) -> bytes:
    """The first stream's last chunk, its choice finished for `reason`, as the region sends it."""
    if tracker.completions:
        kind = "text_completion"
        choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None}
    else:
        kind = "chat.completion.chunk"
        choice = {"index": 0, "delta": {}, "logprobs": None}
    choice["finish_reason"] = reason
    obj = {**tracker.ident, "object": kind, "choices": [choice]}
    return b"data: " + _ENCODE.encode(obj) + b"\n\n"


def length_end(tracker: StreamTracker, usage: bool, prompt: int | None) -> bytes:
    """The end of a stream that reached its length limit, as the region sends it: the choice
    finished for "length", the usage chunk if asked for (`usage`; the request's `prompt`
    tokens, one completion token per text chunk; none if the prompt is unknown), [DONE]."""
    end = _finish_event(tracker, "length")
    if usage and prompt is not None:
        end += _usage_event(tracker, prompt, tracker.events)
    return end + b"data: [DONE]\n\n"


class ChatStitch:
    """A chat (or completions) continuation's events as the first stream's (seam.Stitch): held
    back until past the text the client has, usage covering the whole answer, the first
    stream's identity, its role preamble dropped.

    A client that asked for the usage chunk (`usage`: stream_options.include_usage) gets one
    even when the region that finished sends none (llama-cpp-python never does): made before
    `[DONE]` from the request's prompt tokens (`prompt`, else the router's estimate `counted`)
    and the text chunks the client got, one token each as these servers stream."""

    __slots__ = (
        "catchup",
        "chunks",
        "counted",
        "ended",
        "held",
        "prompt",
        "reported",
        "seam",
        "sent",
        "tracker",
        "usage",
    )

    def __init__(
        self,
        tracker: StreamTracker,
        *,
        prefill: str | None,
        prompt: int | None = None,
        counted: int | None = None,
        usage: bool = False,
        seam: SeamStop | None = None,
    ) -> None:
        self.tracker = tracker
        # Regenerated (no prefill): must repeat what the client has; continued: may answer
        # its prefill back first.
        regenerate = prefill is None
        self.catchup = _Catchup(
            tracker.text if prefill is None else prefill,
            echo=not regenerate,
            completions=tracker.completions,
        )
        self.sent = 0 if regenerate else tracker.events
        self.prompt = prompt
        self.counted = prompt if prompt is not None else counted
        self.usage = usage
        # Text chunks the client has had, this continuation's included; a usage event seen.
        self.chunks = tracker.events
        self.reported = False
        # A stop string the client's text began (seam.SeamStop), and the events held back
        # while the continuation's text may still complete it; the answer ended there.
        self.seam = seam
        self.held: list[bytes] = []
        self.ended = False

    @property
    def through(self) -> bool:
        """The continuation passed the text the client had."""
        return self.catchup.through

    def event(self, event: bytes) -> bytes | None:
        """One event of the continuation as the client gets it; None to drop it."""
        kept = self.catchup.event(event)
        if kept is None or self.ended:
            return None
        if self.seam is not None:
            return self._at_seam(kept)
        return self._relayed(kept)

    def _at_seam(self, event: bytes) -> bytes | None:
        """An event while a stop string begun before the seam may complete: its text held back
        until it cannot; where it does, the answer ends as the region ends one at a stop
        string (finish_reason "stop", the usage asked for, [DONE]), the rest unread."""
        assert self.seam is not None
        payload = sse.data_of(event)
        obj = json_object(payload) if payload is not None and payload != _DONE else None
        choices = obj.get("choices") if obj is not None else None
        piece: object = None
        if isinstance(choices, list) and len(choices) == 1:
            holder, key = _piece_of(choices[0], self.tracker.completions)
            piece = holder.get(key) if holder is not None else None
        if not isinstance(piece, str) or not piece:
            if not self.held:
                return self._relayed(event)
            if not _ends(payload, choices):
                # No text and no end (an empty delta, a comment): it waits with the held text.
                self.held.append(event)
                return None
            # The region's end (or usage) came first: what was held back was its last text.
            self.seam = None
            return self._joined([*self.held, event])
        stopped = self.seam.take(piece)
        if stopped is None:
            self.held.append(event)
            return None
        self.seam = None
        if stopped:
            self.ended = True
            # Made here as the client gets it: the first stream's identity, the usage owed.
            return _finish_event(self.tracker, "stop") + self._owed_usage() + b"data: [DONE]\n\n"
        return self._joined([*self.held, event])

    def _joined(self, events: list[bytes]) -> bytes | None:
        self.held = []
        out = b"".join(e for e in map(self._relayed, events) if e is not None)
        return out or None

    def _relayed(self, kept: bytes) -> bytes | None:
        """An event past the seam as the client gets it: usage covering the whole answer, the
        first stream's identity, the role preamble dropped."""
        payload = sse.data_of(kept)
        if payload == _DONE:
            return self._owed_usage() + kept
        if payload is not None and b'"usage"' in payload:
            if self.sent:
                kept = whole_usage(kept, self.sent, self.prompt)
            self.reported = self.reported or _has_usage(payload)
        if self.usage and not self.reported and payload is not None:
            self.chunks += _text_chunks(payload, self.tracker.completions)
        stamped = restamp(kept.rstrip(b"\n"), self.tracker.ident)
        return None if stamped is None else stamped + b"\n\n"

    def _owed_usage(self) -> bytes:
        """The usage event the client asked for and the region did not send (b"": none owed,
        or the prompt's tokens unknown)."""
        prompt = self.counted
        if not self.usage or self.reported or prompt is None:
            return b""
        self.reported = True
        return _usage_event(self.tracker, prompt, self.chunks)


def _ends(payload: bytes | None, choices: object) -> bool:
    """Whether a chat or completions event without text ends the answer's text: [DONE], a
    finish_reason, or a usage event (no choices); an unreadable event counts as an end."""
    if payload is None:
        return False  # a comment, a bare `event:`
    if payload == _DONE or not isinstance(choices, list) or not choices:
        return True
    return any(not isinstance(c, dict) or c.get("finish_reason") is not None for c in choices)


def _has_usage(payload: bytes) -> bool:
    """Whether a chunk reports usage (an object, not vLLM's `"usage": null`)."""
    obj = json_object(payload)
    return obj is not None and isinstance(obj.get("usage"), dict)


def _text_chunks(payload: bytes, completions: bool) -> int:
    """1 for a chunk carrying text (a token, as StreamTracker counts them), else 0."""
    obj = json_object(payload)
    choices = obj.get("choices") if obj is not None else None
    for choice in choices if isinstance(choices, list) else ():
        holder, key = _piece_of(choice, completions)
        piece = holder.get(key) if holder is not None else None
        if isinstance(piece, str) and piece:
            return 1
    return 0
