"""Token usage from bodies: a request's completion budget, a response's or stream's `usage`.

Pure functions over bytes (msgspec decoders of just the fields they need); the limiter settles
its token reservations with these.
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.core.request import whole_number
from router.errors import InvalidRequest
from router.native import count_tokens
from router.net import sse


class _Budget(msgspec.Struct):
    max_tokens: Any = None
    max_completion_tokens: Any = None
    n: Any = None


_BUDGET = msgspec.json.Decoder(_Budget)


def completion_budget(body: bytes, default: int) -> int:
    """Tokens the answer may use: (max_completion_tokens or max_tokens or default) * n, each
    read as a region would read it; a value no region would read is a 400, never the default."""
    try:
        budget = _BUDGET.decode(body)
    except msgspec.MsgspecError:
        raise InvalidRequest("The request's token fields cannot be read.") from None
    most = (
        whole_number(budget.max_completion_tokens, "max_completion_tokens")
        or whole_number(budget.max_tokens, "max_tokens")
        or default
    )
    n = whole_number(budget.n, "n", minimum=1) or 1
    return max(0, most) * n


class _Usage(msgspec.Struct):
    total_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None


_USAGE = msgspec.json.Decoder(_WithUsage)


def usage_tokens(payload: bytes) -> int | None:
    """total_tokens of a response body or stream event carrying `usage`, else None."""
    if b'"usage"' not in payload:
        return None
    try:
        usage = _USAGE.decode(payload).usage
    except msgspec.MsgspecError:
        return None
    if usage is None:
        return None
    if usage.total_tokens is not None:
        return usage.total_tokens
    if usage.prompt_tokens is None and usage.completion_tokens is None:
        return None
    return (usage.prompt_tokens or 0) + (usage.completion_tokens or 0)


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None  # completions


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []


_CHUNK = msgspec.json.Decoder(_Chunk)
# Generated text kept for counting a stream that reports no usage; beyond this it is estimated.
_MAX_TEXT = 1 << 22


class StreamUsage:
    """A stream's usage: the `usage` chunk it reports last, else a count of the text it sent."""

    __slots__ = ("_decoder", "_size", "_text", "encoding", "prompt_tokens", "total_tokens")

    def __init__(self, prompt_tokens: int = 0, encoding: str | None = None) -> None:
        self._decoder = sse.Decoder()
        self.total_tokens: int | None = None
        self.prompt_tokens = prompt_tokens
        self.encoding = encoding
        self._text: list[str] = []
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        """Consume a piece of the stream as relayed to the client."""
        for payload in self._decoder.feed(chunk):
            found = usage_tokens(payload)
            if found is not None:
                self.total_tokens = found
            elif self.encoding is not None and self.total_tokens is None and payload != sse.DONE:
                self._collect(payload)

    def _collect(self, payload: bytes) -> None:
        try:
            choices = _CHUNK.decode(payload).choices
        except msgspec.MsgspecError:
            return
        for choice in choices:
            text = choice.delta.content if choice.delta is not None else choice.text
            if text:
                self._size += len(text)
                if self._size <= _MAX_TEXT:
                    self._text.append(text)

    def used(self) -> int | None:
        """Total tokens: as reported, else prompt + the counted completion, else None."""
        if self.total_tokens is not None or self.encoding is None:
            return self.total_tokens
        text = "".join(self._text)
        counted = count_tokens(text, self.encoding)
        if self._size > len(text):
            counted = counted * self._size // max(1, len(text))  # past the cap: scale up
        return self.prompt_tokens + counted
