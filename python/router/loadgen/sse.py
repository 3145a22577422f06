"""Pure: OpenAI stream chunk inspection (events are split by router.net.sse, the one parser)."""

from __future__ import annotations

from typing import Literal

import msgspec

from router.net.sse import DONE, Decoder

__all__ = ["DONE", "Decoder", "Endpoint", "StreamError", "chunk_content"]

Endpoint = Literal["chat", "completions"]


class _Delta(msgspec.Struct):
    content: str | None = None


class _ChatChoice(msgspec.Struct):
    delta: _Delta | None = None


class _TextChoice(msgspec.Struct):
    text: str | None = None


class _ChatChunk(msgspec.Struct):
    choices: list[_ChatChoice] = []
    error: dict[str, object] | None = None


class _TextChunk(msgspec.Struct):
    choices: list[_TextChoice] = []
    error: dict[str, object] | None = None


_chat = msgspec.json.Decoder(_ChatChunk)
_text = msgspec.json.Decoder(_TextChunk)


class StreamError(Exception):
    """The stream carried an error object or an undecodable chunk."""


def chunk_content(payload: bytes, endpoint: Endpoint) -> str:
    """The generated text in one stream chunk ('' for role-only or usage chunks)."""
    try:
        chunk = _chat.decode(payload) if endpoint == "chat" else _text.decode(payload)
    except msgspec.DecodeError as exc:
        raise StreamError(f"undecodable chunk: {payload[:80]!r}") from exc
    if chunk.error is not None:
        raise StreamError(str(chunk.error.get("message", chunk.error)))
    parts: list[str] = []
    for choice in chunk.choices:
        if isinstance(choice, _ChatChoice):
            if choice.delta is not None and choice.delta.content:
                parts.append(choice.delta.content)
        elif choice.text:
            parts.append(choice.text)
    return "".join(parts)
