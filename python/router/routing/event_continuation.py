"""Mid-stream resume for the typed-event APIs: OpenAI Responses and Anthropic Messages.

The same guarantees as chat (routing.continuation): the client sees one stream, with nothing
duplicated or lost at the seam, one id, one end. The text streamed so far goes to the next
region as a trailing assistant message (a prefill, which llama-server continues, echoing it
first), or the deterministic request is sent again and its output held back until it passed,
and matched, what the client has. The new stream's opening events are dropped (the client
already had them); its later events are stamped with the first stream's ids and numbering, and
the events that repeat the whole text (`output_text.done`, `response.completed`, ...) get the
whole answer's text and usage.

Only text answers are continued: a stream that opened a tool call, a reasoning item or any
other block ends with its API's failure event, as do Responses requests whose state lives on
the region that failed (`store`, chains, background).
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.core.request import MESSAGES, RESPONSES
from router.core.stream import json_object
from router.net import sse
from router.routing.seam import (
    NEW_TURN,
    Catchup,
    Diverged,
    FirstStream,
    SeamStop,
    SentEvents,
    cap_cached,
    lower_limits,
    with_prefill,
)

_DECODE = msgspec.json.Decoder()
_ENCODE = msgspec.json.Encoder()
# Events a continuation's stream opens with, which the client already had from the first.
_OPENING = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.output_item.added",
        "response.content_part.added",
        "message_start",
        "content_block_start",
        "ping",
    }
)
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete"})


class EventTracker(SentEvents):
    """SentEvents of a typed-event stream: the text of the one message being written, the ids the
    client was given, the last sequence number; `unsupported` once anything but text came."""

    __slots__ = ("item", "item_id", "output_index", "part", "response", "response_id", "sequence")

    def __init__(self) -> None:
        super().__init__()
        self.response_id: str | None = None
        self.item_id: str | None = None
        self.sequence: int | None = None
        # The response, message item and text part as the stream opened them, and the item's
        # place: what the router's own end of the stream (length_end) is made of.
        self.response: dict[str, Any] | None = None
        self.item: dict[str, Any] | None = None
        self.part: dict[str, Any] | None = None
        self.output_index: object = 0

    def _note(self, payload: bytes) -> None:
        obj = json_object(payload)
        if obj is None:
            return
        kind = obj.get("type")
        if not isinstance(kind, str):
            kind = None  # a region's event of another shape: nothing to note but its number
        sequence = obj.get("sequence_number")
        if isinstance(sequence, int):
            self.sequence = sequence
        response = obj.get("response")
        if isinstance(response, dict):
            usage = response.get("usage")
            inputs = usage.get("input_tokens") if isinstance(usage, dict) else None
            if isinstance(inputs, int) and not isinstance(inputs, bool):
                self.prompt = inputs
        if kind == "response.created":
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                self.response_id = response["id"]
                self.response = response
        elif kind == "response.output_item.added":
            item = obj.get("item")
            if not isinstance(item, dict) or item.get("type") != "message" or self.item_id:
                self.unsupported = True
            elif isinstance(item.get("id"), str):
                self.item_id = item["id"]
                self.item = item
                self.output_index = obj.get("output_index", 0)
        elif kind == "response.content_part.added":
            part = obj.get("part")
            if isinstance(part, dict):
                self.part = part
        elif kind == "response.output_text.delta":
            self._piece(obj.get("delta"))
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if (
                obj.get("index", 0) != 0
                or not isinstance(block, dict)
                or block.get("type") != "text"
            ):
                self.unsupported = True
        elif kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta":
                self._piece(delta.get("text"))
            else:
                self.unsupported = True
        elif kind in ("message_stop", "error", "response.failed") or kind in _RESPONSE_ENDS:
            self.done = True

    def _piece(self, text: object) -> None:
        if isinstance(text, str) and text:
            self.pieces.append(text)
            self.events += 1


def continuation_body(
    body: bytes, sent: str, tokens_sent: int, anthropic: bool, first: FirstStream = NEW_TURN
) -> tuple[bytes, str] | None:
    """The request again ending in an assistant message with the text the client has (`sent`,
    after the client's own prefill if any: seam.with_prefill), its length limits lowered by the
    tokens the client already has (seam.lower_limits); and that message's text. None if it
    cannot be continued (a prefill of more than text, a length field that cannot be read)."""
    fields = _DECODE.decode(body)
    shape: dict[str, Any] | None = None
    if anthropic:
        key, endpoint = "messages", MESSAGES
        items = fields[key]
    else:
        key, endpoint, shape = "input", RESPONSES, {"type": "message"}
        items = fields.get(key)
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
    prefilled = with_prefill(list(items or []), sent, first, shape)
    if prefilled is None:
        return None
    fields[key], prefill = prefilled
    if not lower_limits(fields, body, endpoint, first, tokens_sent):
        return None
    return _ENCODE.encode(fields), prefill


def _text_opening(obj: dict[str, Any]) -> bool:
    """Whether an opening event opens the one text answer (not a tool call, a reasoning item,
    a second block): only that can continue the text the client has."""
    kind = obj.get("type")
    if kind == "response.output_item.added":
        item = obj.get("item")
        return isinstance(item, dict) and item.get("type") == "message"
    if kind == "content_block_start":
        block = obj.get("content_block")
        return obj.get("index", 0) == 0 and isinstance(block, dict) and block.get("type") == "text"
    return True


def _encode(obj: dict[str, Any]) -> bytes:
    name = obj.get("type")
    head = b"event: " + name.encode() + b"\n" if isinstance(name, str) else b""
    return head + b"data: " + _ENCODE.encode(obj) + b"\n\n"


class Stitcher:
    """Rewrites a continuation's events into the first stream's (see the module docstring)."""

    __slots__ = (
        "catchup",
        "deltas",
        "emitted",
        "ended",
        "had",
        "held",
        "last",
        "prompt",
        "seam",
        "sent",
        "tracker",
    )

    def __init__(
        self,
        tracker: EventTracker,
        *,
        prefill: str | None,
        prompt: int | None = None,
        seam: SeamStop | None = None,
    ) -> None:
        self.tracker = tracker
        # Regenerated (no prefill): must repeat what the client has; continued: may answer
        # its prefill back first.
        regenerate = prefill is None
        self.had = tracker.text
        self.catchup = Catchup(self.had if prefill is None else prefill, echo=not regenerate)
        self.emitted = ""
        # Tokens the client had that the continuation counted as prompt, not completion.
        self.sent = 0 if regenerate else tracker.events
        # The request's input tokens (the first region's report, else the router's exact count).
        self.prompt = prompt
        # Text deltas the client has had, this continuation's included.
        self.deltas = tracker.events
        # A Messages stop sequence the client's text began (seam.SeamStop), the events held
        # back while the continuation's text may still complete it; the answer ended there.
        self.seam = seam
        self.held: list[bytes] = []
        self.ended = False
        # The new text of the event being rewritten, if it carried any.
        self.last: str | None = None

    @property
    def through(self) -> bool:
        """The continuation passed the text the client had."""
        return self.catchup.through

    @property
    def whole(self) -> str:
        """The whole answer's text so far."""
        return self.had + self.emitted

    def event(self, event: bytes) -> bytes | None:
        """The event to relay, rewritten; None to drop it."""
        if self.ended:
            return None
        self.last = None
        kept = self._rewritten(event)
        if self.seam is None or kept is None:
            return kept
        piece, self.last = self.last, None
        if piece is None:
            # Not text: the region's end came first, and what was held back was its last text.
            self.seam = None
            return self._joined(kept)
        held = self.seam.held
        stopped = self.seam.take(piece)
        if stopped is None:
            self.held.append(kept)
            return None
        if stopped:
            # Neither the held text nor this goes out: it was the stop sequence's.
            self.ended = True
            self.emitted = self.emitted[: len(self.emitted) - len(held) - len(piece)]
            self.deltas -= len(self.held) + 1
            self.held = []
            return self._stop_end(self.seam.matched)
        self.seam = None
        return self._joined(kept)

    def _joined(self, kept: bytes) -> bytes:
        held, self.held = self.held, []
        return b"".join([*held, kept])

    def _stop_end(self, stop: str) -> bytes:
        """The end of a Messages answer at a stop sequence, as the region sends it: the block
        stopped, a message_delta saying stop_sequence (one output token per text delta the
        client got), message_stop."""
        delta = {"stop_reason": "stop_sequence", "stop_sequence": stop}
        usage = {"output_tokens": self.deltas}
        return b"".join(
            _encode(obj)
            for obj in (
                {"type": "content_block_stop", "index": 0},
                {"type": "message_delta", "delta": delta, "usage": usage},
                {"type": "message_stop"},
            )
        )

    def _rewritten(self, event: bytes) -> bytes | None:
        payload = sse.data_of(event)
        obj = json_object(payload) if payload is not None else None
        if obj is None:
            return None
        kind = obj.get("type")
        if kind in _OPENING:
            if not _text_opening(obj):
                raise Diverged(f"the continuation opened something other than text ({kind})")
            return None
        if kind == "response.output_text.delta":
            return self._text(obj, obj, "delta")
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta":
                return self._text(obj, delta, "text")
            raise Diverged("the continuation left the text block")
        if kind in ("content_block_stop", "response.output_text.done", "message_delta"):
            self.catchup.ended()
        if kind in ("response.output_text.done", "response.content_part.done"):
            self._stamp_text(obj)
        elif kind == "response.output_item.done":
            self._stamp_item(obj.get("item"))
        elif kind in _RESPONSE_ENDS:
            self.catchup.ended()
            self._stamp_response(obj.get("response"))
        elif kind == "message_delta":
            usage = obj.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
                usage["output_tokens"] += self.sent
        return self._numbered(obj)

    def _text(self, obj: dict[str, Any], holder: dict[str, Any], key: str) -> bytes | None:
        piece = holder.get(key)
        if not isinstance(piece, str):
            return None
        new = self.catchup.take(piece)
        if not new:
            return None
        holder[key] = new
        self.emitted += new
        self.deltas += 1
        self.last = new
        return self._numbered(obj)

    def _numbered(self, obj: dict[str, Any]) -> bytes:
        tracker = self.tracker
        if tracker.item_id is not None and "item_id" in obj:
            obj["item_id"] = tracker.item_id
        if tracker.sequence is not None:
            obj["sequence_number"] = tracker.sequence + 1
        else:
            obj.pop("sequence_number", None)
        return _encode(obj)

    def _stamp_text(self, obj: dict[str, Any]) -> None:
        if "text" in obj:
            obj["text"] = self.whole
        part = obj.get("part")
        if isinstance(part, dict) and "text" in part:
            part["text"] = self.whole

    def _stamp_item(self, item: object) -> None:
        if not isinstance(item, dict) or item.get("type") != "message":
            return
        if self.tracker.item_id is not None:
            item["id"] = self.tracker.item_id
        for part in item.get("content") or ():
            if isinstance(part, dict) and part.get("type") == "output_text":
                part["text"] = self.whole

    def _stamp_response(self, response: object) -> None:
        if not isinstance(response, dict):
            return
        if self.tracker.response_id is not None:
            response["id"] = self.tracker.response_id
        for item in response.get("output") or ():
            self._stamp_item(item)
        usage = response.get("usage")
        if isinstance(usage, dict) and self.sent:
            inputs, outputs = usage.get("input_tokens"), usage.get("output_tokens")
            if isinstance(inputs, int) and isinstance(outputs, int):
                asked = self.prompt
                usage["input_tokens"] = asked if asked is not None else max(0, inputs - self.sent)
                usage["output_tokens"] = outputs + self.sent
                if isinstance(usage.get("total_tokens"), int):
                    usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
                cap_cached(usage, "input_tokens", "input_tokens_details")


def length_end(tracker: EventTracker, anthropic: bool, prompt: int | None) -> bytes:
    """The end of a stream that reached its length limit, as a region ends one (vLLM's; the
    sim's): Responses' text, part and item done with the whole text, then `response.incomplete`
    (max_output_tokens; usage of the request's `prompt` tokens, when known, and one output
    token per text delta); Messages' block stopped, a message_delta saying max_tokens (one
    output token per text delta), message_stop. Numbered on from the first stream's events."""
    if anthropic:
        delta = {"stop_reason": "max_tokens", "stop_sequence": None}
        return b"".join(
            _encode(obj)
            for obj in (
                {"type": "content_block_stop", "index": 0},
                {
                    "type": "message_delta",
                    "delta": delta,
                    "usage": {"output_tokens": tracker.events},
                },
                {"type": "message_stop"},
            )
        )
    whole = tracker.text
    where = {"item_id": tracker.item_id, "output_index": tracker.output_index, "content_index": 0}
    part = {**(tracker.part or {"type": "output_text", "annotations": []}), "text": whole}
    item = {
        **(tracker.item or {"type": "message", "id": tracker.item_id, "role": "assistant"}),
        "status": "completed",
        "content": [part],
    }
    response: dict[str, Any] = {
        **(tracker.response or {"id": tracker.response_id, "object": "response"}),
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [item],
    }
    if prompt is not None:
        outputs = tracker.events
        response["usage"] = {
            "input_tokens": prompt,
            "output_tokens": outputs,
            "total_tokens": prompt + outputs,
        }
    events: tuple[dict[str, Any], ...] = (
        {"type": "response.output_text.done", **where, "text": whole},
        {"type": "response.content_part.done", **where, "part": part},
        {"type": "response.output_item.done", "output_index": tracker.output_index, "item": item},
        {"type": "response.incomplete", "response": response},
    )
    out = []
    for number, obj in enumerate(events, 1):
        if tracker.sequence is not None:
            obj["sequence_number"] = tracker.sequence + number
        out.append(_encode(obj))
    return b"".join(out)
