"""Pure: incremental Server-Sent Events parsing and OpenAI stream chunk inspection."""

from __future__ import annotations

from typing import Literal

import msgspec

Endpoint = Literal["chat", "completions"]

DONE = b"[DONE]"


class SseParser:
    """Feeds raw bytes, yields the `data:` payload of each complete event."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """Consume bytes; return payloads of events completed by them."""
        self._buf += chunk
        out: list[bytes] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return out
            line = self._buf[:nl].rstrip(b"\r")
            self._buf = self._buf[nl + 1 :]
            if not line:
                # A blank line dispatches the event (multi-line data joins with \n, per the spec).
                if self._data:
                    out.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # Comments (":") and other fields (event, id, retry) carry nothing we measure.


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
