"""Token usage from bodies: a request's completion budget, a response's or stream's `usage`.

Pure functions over bytes (msgspec decoders of just the fields they need); the limiter settles
its token reservations with these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from router.core.request import CHAT, COMPLETIONS, MAX_WHOLE, MESSAGES, RESPONSES, whole_number
from router.errors import InvalidRequest
from router.native import count_tokens
from router.net import sse


class _Budget(msgspec.Struct):
    max_tokens: Any = None
    max_completion_tokens: Any = None
    max_output_tokens: Any = None
    n: Any = None
    # llama.cpp's server's own: the answer's length (read before the others, negative: no
    # bound) and the choices per prompt (read before `n`).
    n_predict: Any = None
    n_cmpl: Any = None


_BUDGET = msgspec.json.Decoder(_Budget)


# The fields that bound an answer's length where each API's regions read them, first first:
# chat takes max_completion_tokens over max_tokens; the others one field each, and no `n`.
_BOUNDS: dict[str, tuple[str, ...]] = {
    CHAT: ("max_completion_tokens", "max_tokens"),
    COMPLETIONS: ("max_tokens",),
    RESPONSES: ("max_output_tokens",),
    MESSAGES: ("max_tokens",),
}
# What llama.cpp's server reads after its own `n_predict` (_llama_bound): the same, but for a
# Responses request the chat fields too (it turns the whole body into a chat request).
_LLAMA_BOUNDS = {**_BOUNDS, RESPONSES: ("max_output_tokens", "max_completion_tokens", "max_tokens")}


def _first_set(budget: _Budget, names: tuple[str, ...]) -> int:
    """The first of `names` set to a positive length (0: none). A negative one is llama.cpp's
    server's "no bound", and it reads no later field then: 0 (the default)."""
    for name in names:
        most = whole_number(getattr(budget, name), name, minimum=-MAX_WHOLE)
        if most is not None and most < 0:
            return 0
        if most:
            return most
    return 0


def _llama_bound(budget: _Budget, names: tuple[str, ...], default: int) -> int:
    """What llama.cpp's server may generate: its `n_predict` first (a negative one is no bound
    at all: `default`), else the first of `names` set, else `default`."""
    n_predict = whole_number(budget.n_predict, "n_predict", minimum=-MAX_WHOLE)
    if n_predict is not None and n_predict < 0:
        return default
    if n_predict:
        return n_predict
    return _first_set(budget, names) or default


def completion_budget(body: bytes, default: int, endpoint: str = CHAT, prompts: int = 1) -> int:
    """Tokens the answer may use, as the most any region could generate: the first of the
    API's length fields that is set, or the first of llama.cpp's server's (`n_predict`
    first), whichever is larger (else `default`), times the choices (`n`, or llama.cpp's
    `n_cmpl`, whichever is larger; chat and completions) and the `prompts` (a completions
    batch answers each). Each number is read as a region would read it; a value no region
    would read is a 400, never the default."""
    try:
        budget = _BUDGET.decode(body)
    except msgspec.MsgspecError:
        raise InvalidRequest("The request's token fields cannot be read.") from None
    bounds = _BOUNDS.get(endpoint, _BOUNDS[CHAT])
    default = max(0, default)
    most = max(
        _first_set(budget, bounds) or default,
        _llama_bound(budget, _LLAMA_BOUNDS.get(endpoint, bounds), default),
    )
    n = 1
    if endpoint in (CHAT, COMPLETIONS):
        n = whole_number(budget.n, "n", minimum=1) or 1
        n = max(n, whole_number(budget.n_cmpl, "n_cmpl", minimum=1) or 1)
    return most * n * prompts


def length_bound(body: bytes, endpoint: str, llama: bool) -> int | None:
    """The most tokens one answer may have as a region reads the request (`llama`: llama.cpp's
    server, its `n_predict` first, a negative one no bound at all), else the first of the API's
    length fields set; None: no bound. Raises InvalidRequest as completion_budget does."""
    try:
        budget = _BUDGET.decode(body)
    except msgspec.MsgspecError:
        raise InvalidRequest("The request's token fields cannot be read.") from None
    bounds = _BOUNDS.get(endpoint, _BOUNDS[CHAT])
    if llama:
        most = _llama_bound(budget, _LLAMA_BOUNDS.get(endpoint, bounds), 0)
    else:
        most = _first_set(budget, bounds)
    return most or None


# The most tokens one answer may report: beyond any model's context by far; a count outside
# 0..this (a negative one would refill the key's bucket, one past 64 bits overflowed it) makes
# the whole report unknown, as if the region had sent none.
MAX_REPORTED = 2**31 - 1
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_REPORTED)]


class _Usage(msgspec.Struct):
    # OpenAI chat and completions.
    total_tokens: _Count | None = None
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    # OpenAI Responses and Anthropic Messages (whose input_tokens leave out cached ones).
    input_tokens: _Count | None = None
    output_tokens: _Count | None = None
    cache_read_input_tokens: _Count | None = None
    cache_creation_input_tokens: _Count | None = None


class _Nested(msgspec.Struct):
    usage: _Usage | None = None


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None
    # Responses API stream events carry it in `response`; Anthropic's message_start in `message`.
    response: _Nested | None = None
    message: _Nested | None = None


_USAGE = msgspec.json.Decoder(_WithUsage)


class Used(msgspec.Struct, frozen=True):
    """Reported token usage: prompt (input) and completion (output) tokens, and the total."""

    prompt: int | None
    completion: int | None
    total: int | None

    def sum(self) -> int | None:
        """The total as reported, else prompt + completion, else None."""
        if self.total is not None:
            return self.total
        if self.prompt is None and self.completion is None:
            return None
        return (self.prompt or 0) + (self.completion or 0)


def reported_usage(payload: bytes) -> Used | None:
    """The `usage` of a response body or stream event, in any of the APIs' shapes."""
    if b'"usage"' not in payload:
        return None
    try:
        doc = _USAGE.decode(payload)
    except (msgspec.MsgspecError, RecursionError):
        return None
    usage = doc.usage
    if usage is None:
        for nested in (doc.response, doc.message):
            if nested is not None and nested.usage is not None:
                usage = nested.usage
                break
        else:
            return None
    prompt = usage.prompt_tokens
    completion = usage.completion_tokens
    if usage.input_tokens is not None:
        prompt = (
            usage.input_tokens
            + (usage.cache_read_input_tokens or 0)
            + (usage.cache_creation_input_tokens or 0)
        )
    if usage.output_tokens is not None:
        completion = usage.output_tokens
    if prompt is None and completion is None and usage.total_tokens is None:
        return None
    return Used(prompt, completion, usage.total_tokens)


def usage_tokens(payload: bytes) -> int | None:
    """Total tokens of a response body or stream event carrying `usage`, else None."""
    used = reported_usage(payload)
    return used.sum() if used is not None else None


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function | None = None


class _Delta(msgspec.Struct):
    # Everything a chat delta generates: text, reasoning (vLLM's and llama.cpp's
    # `reasoning_content`, newer servers' `reasoning`), a refusal, tool and function calls.
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None
    function_call: _Function | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None  # completions


class _EventDelta(msgspec.Struct):
    # Anthropic's content_block_delta: text, a tool call's JSON, or thinking.
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None


class _Chunk(msgspec.Struct):
    # OpenAI chat and completions.
    choices: list[_Choice] = []
    # Typed events: the Responses API's output_text.delta (a string), Anthropic's
    # content_block_delta (an object).
    type: str | None = None
    delta: str | _EventDelta | None = None


_CHUNK = msgspec.json.Decoder(_Chunk)
# The Responses API's events whose `delta` is generated text: the answer, reasoning, a
# function call's arguments, a refusal.
_GENERATED = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.refusal.delta",
    }
)
# Generated text kept for counting a stream that reports no usage; beyond this it is estimated.
_MAX_TEXT = 1 << 22


class StreamUsage:
    """A stream's usage: the `usage` chunk it reports last, else a count of the text it sent."""

    __slots__ = (
        "_completion",
        "_count",
        "_decoder",
        "_prompt",
        "_size",
        "_text",
        "encoding",
        "prompt_tokens",
        "total_tokens",
    )

    def __init__(
        self,
        prompt_tokens: int = 0,
        encoding: str | None = None,
        count: Callable[[str], int] | None = None,
    ) -> None:
        self._decoder = sse.Decoder()
        self.total_tokens: int | None = None
        self.prompt_tokens = prompt_tokens
        # What counts the text sent: the model's own tokenizer (`count`), else `encoding`.
        self.encoding = encoding
        self._count = count
        self._text: list[str] = []
        self._size = 0
        # Anthropic reports input tokens at the start and output tokens at the end.
        self._prompt: int | None = None
        self._completion: int | None = None

    def feed(self, chunk: bytes) -> None:
        """Consume a piece of the stream as relayed to the client."""
        for payload in self._decoder.feed(chunk):
            found = reported_usage(payload)
            if found is not None:
                if found.prompt is not None:
                    self._prompt = found.prompt
                if found.completion is not None and b'"message_start"' not in payload:
                    # (Anthropic's opening event reports input tokens and a placeholder output.)
                    self._completion = found.completion
                if found.total is not None:
                    self.total_tokens = found.total
                elif self._completion is not None:
                    self.total_tokens = (self._prompt or 0) + self._completion
            elif self.encoding is not None and self.total_tokens is None and payload != sse.DONE:
                self._collect(payload)

    def _collect(self, payload: bytes) -> None:
        try:
            chunk = _CHUNK.decode(payload)
        except (msgspec.MsgspecError, RecursionError):
            return
        for choice in chunk.choices:
            d = choice.delta
            if d is None:
                self._keep(choice.text)
                continue
            self._keep(d.content)
            # One reasoning text, however many fields carry it: servers moving from
            # `reasoning_content` to `reasoning` send both, and llama.cpp's deepseek-legacy
            # format keeps the reasoning in `content` as well.
            reasoning = d.reasoning_content or d.reasoning
            if reasoning and not (d.content and reasoning in d.content):
                self._keep(reasoning)
            self._keep(d.refusal)
            calls = [c.function for c in d.tool_calls or () if c.function is not None]
            if d.function_call is not None:
                calls.append(d.function_call)
            for call in calls:
                self._keep(call.name)
                self._keep(call.arguments)
        delta = chunk.delta
        if isinstance(delta, str):
            if chunk.type in _GENERATED:
                self._keep(delta)
        elif delta is not None:
            self._keep(delta.text or delta.partial_json or delta.thinking)

    def _keep(self, text: str | None) -> None:
        if text:
            self._size += len(text)
            if self._size <= _MAX_TEXT:
                self._text.append(text)

    def used(self) -> int | None:
        """Total tokens: as reported, else prompt + the counted completion, else None."""
        if self.total_tokens is not None or self.encoding is None:
            return self.total_tokens
        text = "".join(self._text)
        counted = (
            self._count(text) if self._count is not None else count_tokens(text, self.encoding)
        )
        if self._size > len(text):
            counted = counted * self._size // max(1, len(text))  # past the cap: scale up
        # The input the stream reported (Anthropic's opening event), else the estimate.
        prompt = self._prompt if self._prompt is not None else self.prompt_tokens
        return prompt + counted
