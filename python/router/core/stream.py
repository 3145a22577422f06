"""What the relay learns from a stream's events: valid or not, finished or not, [DONE] or not.

A stream counts as complete only when every choice it carried got a `finish_reason`: a region
that ends with `[DONE]` before that was cut (llama-cpp-python does, when a new request
interrupts it), and one that finished every choice but never sent `[DONE]` did finish.
An event that is not JSON (invalid UTF-8 included) is dropped; a chat chunk carrying an
`error` (vLLM's failure inside a stream) ends the region's stream there, never relayed.
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.net import sse
from router.net.sse import DONE


class _Choice(msgspec.Struct):
    index: int = 0
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: dict[str, object] | None = None
    # vLLM's failure inside a stream: `data: {"error": {...}}`, then [DONE].
    error: object = None


_CHUNK = msgspec.json.Decoder(_Chunk)
_RAW = msgspec.json.Decoder(msgspec.Raw)
_DECODE = msgspec.json.Decoder()
DONE_EVENT = b"data: [DONE]\n\n"
# One SSE event above this fails the stream (a never-ending line must not cost unbounded work).
DEFAULT_MAX_EVENT_BYTES = 1 << 20


def kept_usage(kept: list[bytes], payload: bytes) -> None:
    """Keep the first and the latest payload reporting usage: the latest has the whole count
    (usage is cumulative), the first the input tokens where an API reports them apart (the
    Messages API's message_start); a server reporting on every chunk costs two, not all."""
    if len(kept) < 2:
        kept.append(payload)
    else:
        kept[1] = payload


def json_object(payload: bytes) -> dict[str, Any] | None:
    """A JSON object payload, else None."""
    try:
        obj = _DECODE.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _not_json(payload: bytes) -> bool:
    """Whether a payload a typed decoder could not read is not JSON at all (dropped), rather
    than JSON of another shape (relayed)."""
    try:
        _RAW.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return True  # nested past what the decoders reach: not passed on unchecked
    return False


def is_error_event(payload: bytes) -> bool:
    """Whether a chat payload is the region's error event, as StreamState reads it (an `error`,
    no choices, no usage)."""
    try:
        if not payload.isascii():
            payload.decode()
        chunk = _CHUNK.decode(payload)
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        return False
    return not chunk.choices and chunk.usage is None and bool(chunk.error)


def error_message(payload: bytes) -> str:
    """What an error event's payload says, for the log and the event ending the stream."""
    doc = json_object(payload)
    if doc is None:
        return "error event"
    error = doc.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return f"error event: {str(message)[:200]}"


# What a Responses or Messages failure event says that is the region's fault, not the
# request's: its server's error, overload or timeout, its rate limit (OpenAI's error types and
# codes, Anthropic's error types). Any other (invalid_request_error, invalid_prompt, ...)
# blames the request: another region would say the same.
_RATE_LIMITS = frozenset({"rate_limit_error", "rate_limit_exceeded"})
_REGION_FAULTS = _RATE_LIMITS | {"server_error", "api_error", "overloaded_error", "timeout_error"}


def region_failure(payload: bytes) -> tuple[int, dict[str, object]] | None:
    """The error of a typed-event API's failure event when it is the region's fault: the HTTP
    status it stands for (429 for a rate limit, else 502) and the error in OpenAI's error
    object shape (`message`, `type`, `code`); else None. Its `error` event
    holds the error's fields (OpenAI's Responses API) or an `error` object (Anthropic's, and
    servers that nest it); `response.failed` holds it in the failed response's `error`."""
    event = json_object(payload)
    if event is None:
        return None
    kind = event.get("type")
    error: object = None
    if kind == "error":
        nested = event.get("error")
        error = nested if isinstance(nested, dict) else event
    elif kind == "response.failed":
        response = event.get("response")
        error = response.get("error") if isinstance(response, dict) else None
    if not isinstance(error, dict):
        return None
    what, code = error.get("type"), error.get("code")
    if what not in _REGION_FAULTS and code not in _REGION_FAULTS:
        return None
    message = error.get("message")
    # Busy, as a 429 says (no failure of the region's health), or failing.
    status = 429 if what in _RATE_LIMITS or code in _RATE_LIMITS else 502
    return status, {
        "message": message if isinstance(message, str) else f"{code or what}",
        "type": "server_error" if what in (None, "error") else what,
        "code": code,
    }


class StreamState:
    """Notes every payload the relay passes on; `complete` once the stream really finished."""

    __slots__ = ("done", "error", "finishes", "held_done", "invalid", "usage", "usage_only")

    # A chat stream's own failure is its error event (`error`), never relayed.
    failed = False

    def __init__(self) -> None:
        self.done = False
        # The payload of the region's error event that ended its stream (None: none came).
        self.error: bytes | None = None
        # A [DONE] that came before every choice finished: never relayed (it would make a cut
        # stream look complete); sent at the end only if the stream did finish after all.
        self.held_done = False
        # finish_reason per choice index (None: the choice is still open).
        self.finishes: dict[int, str | None] = {}
        # Events dropped because they were not JSON.
        self.invalid = 0
        # Whether the last payload noted carried only usage (no choices).
        self.usage_only = False
        # The payloads that reported usage, as sent: see kept_usage.
        self.usage: list[bytes] = []

    def note(self, payload: bytes) -> bool:
        """Note one data payload (UTF-8: see utf8_only); False when it must not be relayed: not
        valid JSON, or the region's error event (then `error`)."""
        self.usage_only = False
        if payload == DONE:
            self.done = True
            return True
        try:
            chunk = _CHUNK.decode(payload)
        except msgspec.ValidationError:
            # Valid JSON of another shape (a field of an unexpected type).
            return True
        except (msgspec.DecodeError, RecursionError):
            if _not_json(payload):
                self.invalid += 1
                return False
            return True
        if chunk.usage is not None:
            kept_usage(self.usage, payload)
        choices = chunk.choices
        if choices:
            finishes = self.finishes
            for choice in choices:
                if choice.finish_reason is not None or choice.index not in finishes:
                    finishes[choice.index] = choice.finish_reason
        elif chunk.usage is not None:
            self.usage_only = True
        elif chunk.error:
            self.error = payload
            return False
        return True

    def passable(
        self, events: list[bytes], strip_usage: bool, stripped: list[bytes] | None
    ) -> bytes:
        """`passable` for a chat stream: `note` and `payload_of` inlined, in one loop over the
        events (per event, the calls cost more than decoding it), the events joined as they
        came unless one is dropped; an error event ends them (see `error`)."""
        kept: list[bytes] | None = None  # None while every event so far passes
        finishes = self.finishes
        decode = _CHUNK.decode
        whole = b"".join(events)
        if not whole.isascii():
            events = utf8_only(events, self)
            whole = b"".join(events)
        for i, event in enumerate(events):
            # The usual event, one `data:` line (see payload_of).
            if event.startswith(b"data:") and event.count(b"\n") == 2 and b"\r" not in event:
                payload: bytes | None = event[6:-2] if event[5:6] == b" " else event[5:-2]
            else:
                payload = sse.data_of(event)
            keep = True
            if payload is not None:
                self.usage_only = False
                if payload == DONE:
                    self.done = True
                    if not self.complete:
                        self.held_done = True
                        keep = False
                else:
                    try:
                        chunk = decode(payload)
                    except msgspec.ValidationError:
                        pass  # valid JSON of another shape
                    except (msgspec.DecodeError, RecursionError):
                        if _not_json(payload):
                            self.invalid += 1
                            keep = False
                    else:
                        if chunk.usage is not None:
                            kept_usage(self.usage, payload)
                        choices = chunk.choices
                        if choices:
                            for choice in choices:
                                reason = choice.finish_reason
                                if reason is not None or choice.index not in finishes:
                                    finishes[choice.index] = reason
                        elif chunk.usage is not None:
                            self.usage_only = True
                            if strip_usage:
                                if stripped is not None:
                                    stripped.append(event)
                                keep = False
                        elif chunk.error:
                            # The region's stream ends here: what follows is not relayed.
                            self.error = payload
                            return b"".join(events[:i] if kept is None else kept)
            if keep:
                if kept is not None:
                    kept.append(event)
            elif kept is None:
                kept = events[:i]
        return whole if kept is None else b"".join(kept)

    @property
    def finished(self) -> bool:
        """Every choice seen got a finish_reason (and there was at least one)."""
        finishes = self.finishes
        return bool(finishes) and all(r is not None for r in finishes.values())

    @property
    def owes_done(self) -> bool:
        """Whether a complete stream still needs its [DONE] sent: the region left it out, or it
        came early and was held back."""
        return not self.done or self.held_done

    @property
    def complete(self) -> bool:
        """The stream finished: every choice ended; or, with no choice at all, [DONE] came."""
        if self.finishes:
            return self.finished
        return self.done

    @property
    def cut_reason(self) -> str:
        """Why a stream that ended here is not complete."""
        if self.error is not None:
            return error_message(self.error)
        return (
            "stream ended before every choice finished"
            if self.done
            else ("stream ended without [DONE]")
        )


# The most output items of one response noted for later references (each is one more note,
# and one Redis write when shared); the API makes a few per response.
MAX_NOTED_ITEMS = 256


def output_ids(output: object) -> list[str]:
    """The ids of a response's output items (objects with a string `id`; anything else in the
    list is skipped), at most MAX_NOTED_ITEMS."""
    if not isinstance(output, list):
        return []
    ids = [i for item in output if isinstance(item, dict) and isinstance(i := item.get("id"), str)]
    return [i for i in ids if i][:MAX_NOTED_ITEMS]


class _Ref(msgspec.Struct):
    id: str | None = None
    # A Responses API response's output items (whole in its terminal event), read leniently
    # (output_ids): one odd item must not hide the event's end.
    output: list[object] | None = None


class _Event(msgspec.Struct):
    type: str | None = None
    sequence_number: int | None = None
    response: _Ref | None = None


_EVENT = msgspec.json.Decoder(_Event)
# The typed-event APIs' terminal events that end a stream as failed.
_FAILURE_ENDS = frozenset({"error", "response.failed"})


class EventState:
    """StreamState for APIs of typed events (OpenAI Responses, Anthropic Messages): complete
    once a terminal event came; the Responses stream's id and last sequence number noted for
    the failure event that may have to end it."""

    __slots__ = (
        "done",
        "ended",
        "failed",
        "held_done",
        "invalid",
        "items",
        "response_id",
        "sequence",
        "terminal",
        "usage",
        "usage_only",
    )

    # These APIs end a failed stream with their own failure event, relayed (see `failed`).
    error = None

    def __init__(self, terminal: frozenset[str]) -> None:
        self.terminal = terminal
        self.ended = False
        # The terminal event that came is the region's failure (`error`, `response.failed`).
        self.failed = False
        self.done = False
        self.held_done = False
        self.invalid = 0
        self.usage_only = False
        self.response_id: str | None = None
        # The ids of the output items its terminal event lists (stored with the response).
        self.items: list[str] = []
        self.sequence: int | None = None
        # The payloads that may report usage, as sent: see kept_usage.
        self.usage: list[bytes] = []

    def note(self, payload: bytes) -> bool:
        """Note one data payload; False when it is not valid JSON (and must not be relayed)."""
        if payload == DONE:
            self.done = True
            return True
        try:
            event = _EVENT.decode(payload)
        except msgspec.ValidationError:
            return True
        except (msgspec.DecodeError, RecursionError):
            if _not_json(payload):
                self.invalid += 1
                return False
            return True
        if event.sequence_number is not None:
            self.sequence = event.sequence_number
        if event.response is not None and event.response.id and self.response_id is None:
            self.response_id = event.response.id
        if event.type in self.terminal:
            self.ended = True
            self.failed = event.type in _FAILURE_ENDS
            if event.response is not None and event.response.output:
                self.items = output_ids(event.response.output)
        if b'"usage"' in payload:
            kept_usage(self.usage, payload)
        return True

    @property
    def complete(self) -> bool:
        """A terminal event came."""
        return self.ended

    @property
    def owes_done(self) -> bool:
        """These APIs end with their terminal event: no [DONE] is added."""
        return False

    @property
    def cut_reason(self) -> str:
        """Why a stream that ended here is not complete."""
        return "stream ended before its terminal event"


def utf8_only(events: list[bytes], state: StreamState | EventState) -> list[bytes]:
    """The events whose data is UTF-8, for a read with bytes past ASCII: another's is not JSON,
    dropped and counted (msgspec skips a string it does not decode unread, so it can tell only
    for the fields it reads)."""
    kept = []
    for event in events:
        payload = payload_of(event)
        if payload is not None and not payload.isascii():
            try:
                payload.decode()
            except UnicodeDecodeError:
                state.invalid += 1
                continue
        kept.append(event)
    return kept


def payload_of(event: bytes) -> bytes | None:
    """An event's data, with a fast path for the usual one-line `data: ...` event."""
    # A whole event (as sse.Splitter cuts them) without a CR ends with LF LF: with two LFs in
    # all, it is one line. A CR ends a line too: sse.data_of reads those (no CR in a payload).
    if event.startswith(b"data:") and event.count(b"\n") == 2 and b"\r" not in event:
        value = event[5:-2]
        return value[1:] if value.startswith(b" ") else value
    return sse.data_of(event)


def passable(
    events: list[bytes],
    state: StreamState | EventState,
    strip_usage: bool,
    stripped: list[bytes] | None = None,
) -> bytes:
    """The events to relay: invalid ones dropped; a usage chunk nobody asked for too (into
    `stripped`: the router asked for it, to settle the request with the region's numbers)."""
    if type(state) is StreamState:
        return state.passable(events, strip_usage, stripped)
    return passable_each(events, state, strip_usage, stripped)


def passable_each(
    events: list[bytes],
    state: StreamState | EventState,
    strip_usage: bool,
    stripped: list[bytes] | None = None,
) -> bytes:
    """`passable` event by event, for any stream state (StreamState's one loop must equal it)."""
    if not all(map(bytes.isascii, events)):
        events = utf8_only(events, state)
    out = []
    for event in events:
        payload = payload_of(event)
        if payload is not None:
            if not state.note(payload):
                if state.error is not None:
                    break  # the region's error event ends its stream
                continue
            if state.done and payload == DONE and not state.complete:
                state.held_done = True
                continue
            if strip_usage and state.usage_only:
                if stripped is not None:
                    stripped.append(event)
                continue
        out.append(event)
    return b"".join(out)
