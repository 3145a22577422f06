"""The APIs the router speaks, and what differs between them on the request path.

OpenAI's chat completions, completions and embeddings stream `data:` chunks ended by `[DONE]`;
OpenAI's Responses API and Anthropic's Messages API stream typed events (`event:` + a JSON
`type`) ended by a terminal event and no `[DONE]`. A `Dialect` says, as data and small pure
functions: the error shape, which stream events are preamble (not yet a token), which end the
stream, and the event that ends a stream the router had to cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from router.core.request import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    EMBEDDINGS,
    INPUT_TOKENS,
    MESSAGES,
    RESPONSES,
)
from router.core.responses import stream_error_event
from router.core.stream import EventState, StreamState, output_ids, payload_of
from router.errors import anthropic_error_body
from router.net import sse


class _Typed(msgspec.Struct):
    type: str | None = None


_TYPED = msgspec.json.Decoder(_Typed)


def _typed_has_token(preamble: frozenset[str]) -> Callable[[bytes], bool]:
    def has_token(event: bytes) -> bool:
        """Whether one whole event of the stream is more than preamble (a comment or a field
        without data is not)."""
        payload = payload_of(event)
        if not payload:
            return False
        if payload == sse.DONE:
            return True
        try:
            kind = _TYPED.decode(payload).type
        except (msgspec.MsgspecError, RecursionError):
            return True  # not an event this check understands: do not hold it back
        return kind not in preamble

    return has_token


class _Made(msgspec.Struct):
    id: str | None = None
    object: str | None = None
    # Read leniently (output_ids): one odd item must not hide the response's own id.
    output: list[Any] | None = None


_MADE = msgspec.json.Decoder(_Made)


def _made(body: bytes) -> _Made | None:
    try:
        made = _MADE.decode(body)
    except (msgspec.MsgspecError, RecursionError):
        return None
    return made if made.object == "response" else None


def response_id(body: bytes) -> str | None:
    """The id of a whole Responses API answer (`"object": "response"`), else None."""
    made = _made(body)
    return made.id if made is not None else None


def stored_ids(body: bytes) -> list[str]:
    """What a whole Responses API answer leaves stored at its region for later requests to
    refer to: its id, then its output items' ids (`item_reference`); none for another body."""
    made = _made(body)
    if made is None or made.id is None:
        return []
    return [made.id, *output_ids(made.output)]


class Dialect:
    """One API's shape on the request path (see the module docstring)."""

    __slots__ = ("anthropic", "endpoint", "events", "has_token", "name", "terminal")

    def __init__(
        self,
        name: str,
        endpoint: str,
        *,
        anthropic: bool = False,
        preamble: frozenset[str] = frozenset(),
        terminal: frozenset[str] = frozenset(),
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        # Errors in Anthropic's shape instead of OpenAI's.
        self.anthropic = anthropic
        # Streams of typed events ended by one of `terminal` (no [DONE]).
        self.events = bool(terminal)
        self.terminal = terminal
        # Whether one whole event of a stream is its first token; None: OpenAI's chunks, read
        # by core.attempt.has_token.
        self.has_token = _typed_has_token(preamble) if self.events else None

    def tracker(self) -> StreamState | EventState:
        """A fresh stream state for one relayed stream."""
        return EventState(self.terminal) if self.events else StreamState()

    def stream_failure(
        self, message: str, state: StreamState | EventState, code: str = "upstream_stream_error"
    ) -> bytes:
        """The event that ends a stream the router could not finish: one the API's clients
        treat as a failure, never as a complete answer (`code` where the API carries one)."""
        if not self.events:
            return stream_error_event(message, code)
        if self.anthropic:
            body = anthropic_error_body(500, message)
            return b"event: error\ndata: " + body + b"\n\n"
        assert isinstance(state, EventState)
        response: dict[str, object] = {
            "id": state.response_id or "",
            "object": "response",
            "status": "failed",
            "output": [],
            "error": {"code": "server_error", "message": message},
        }
        event: dict[str, object] = {"type": "response.failed", "response": response}
        if state.sequence is not None:
            event["sequence_number"] = state.sequence + 1
        return b"event: response.failed\ndata: " + msgspec.json.encode(event) + b"\n\n"


CHAT_API = Dialect("chat", CHAT)
COMPLETIONS_API = Dialect("completions", COMPLETIONS)
EMBEDDINGS_API = Dialect("embeddings", EMBEDDINGS)
RESPONSES_API = Dialect(
    "responses",
    RESPONSES,
    preamble=frozenset(
        {
            "response.created",
            "response.in_progress",
            "response.queued",
            "response.output_item.added",
            "response.content_part.added",
        }
    ),
    # response.failed and error are the region's own ends: relayed, never continued (before
    # any token, one blaming the region fails the attempt instead: core.attempt).
    terminal=frozenset({"response.completed", "response.incomplete", "response.failed", "error"}),
)
MESSAGES_API = Dialect(
    "messages",
    MESSAGES,
    anthropic=True,
    preamble=frozenset({"message_start", "content_block_start", "ping"}),
    terminal=frozenset({"message_stop", "error"}),
)
# Prompt counts: whole answers only, each in its API's error shape.
INPUT_TOKENS_API = Dialect("input_tokens", INPUT_TOKENS)
COUNT_TOKENS_API = Dialect("count_tokens", COUNT_TOKENS, anthropic=True)
DIALECTS = {
    d.endpoint: d
    for d in (
        CHAT_API,
        COMPLETIONS_API,
        EMBEDDINGS_API,
        RESPONSES_API,
        MESSAGES_API,
        INPUT_TOKENS_API,
        COUNT_TOKENS_API,
    )
}


def dialect_of(path: str) -> Dialect:
    """The dialect of a router path (OpenAI's for any path it does not serve)."""
    return DIALECTS.get(path, CHAT_API)
