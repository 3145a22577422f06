"""How the simulated region renders one generated answer in each API, whole or as SSE.

Every API shares the sim's generation and faults (sim.server); only the shapes differ. The
quirks follow the real servers (tests/real pins them): llama-server's Responses events carry no
`sequence_number` and say `completed` even when cut by the token limit; vLLM's number their
events and say `incomplete`. Both answer a Messages prefill (a trailing assistant message) back
first, then the new text (the sim does that for llama-server only, as for chat).
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

_ENCODE = msgspec.json.Encoder()
# An injected error per kind (sim.server.ERROR_KINDS): the status of a whole answer, OpenAI's
# error type and code, Anthropic's error type.
ERRORS: dict[str, tuple[int, str, str, str]] = {
    "server": (500, "server_error", "server_error", "api_error"),
    "overloaded": (503, "server_error", "server_error", "overloaded_error"),
    "rate_limit": (429, "rate_limit_error", "rate_limit_exceeded", "rate_limit_error"),
    "invalid_request": (400, "invalid_request_error", "invalid_prompt", "invalid_request_error"),
}


def _said(kind: str, name: str) -> str:
    return f"sim region {name}: injected {kind} error"


def _event(name: str | None, payload: dict[str, Any]) -> bytes:
    head = b"event: " + name.encode() + b"\n" if name is not None else b""
    return head + b"data: " + _ENCODE.encode(payload) + b"\n\n"


class Render(Protocol):
    """One answer's shapes: the whole body, and the stream's events around its tokens."""

    def body(self, content: str, finish: str) -> dict[str, Any]: ...
    def start(self) -> list[bytes]: ...
    def token(self, text: str) -> bytes: ...
    def end(self, content: str, finish: str) -> list[bytes]: ...
    def error(self, kind: str, name: str, failed: bool) -> list[bytes]: ...


class Chat:
    """OpenAI chat completions and completions: `choices` answers to one prompt (each the same
    text, their chunks interleaved, as llama-server's `n_cmpl` streams them); a chat answer that
    is a call of the function `tool` (its arguments streamed as the tokens) when one is named."""

    def __init__(
        self,
        chat: bool,
        ident: str,
        model: str,
        created: int,
        usage: dict[str, int],
        stream_usage: bool,
        choices: int = 1,
        tool: str | None = None,
    ) -> None:
        self.chat = chat
        self.usage = usage
        self.stream_usage = stream_usage
        self.choices = choices
        self.tool = tool if chat else None
        self.call = {"id": "call_" + ident[-12:], "type": "function"}
        self.base: dict[str, Any] = {
            "id": ident,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }
        if stream_usage:
            self.base["usage"] = None

    def _finish(self, finish: str) -> str:
        return "tool_calls" if self.tool is not None and finish == "stop" else finish

    def body(self, content: str, finish: str) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for index in range(self.choices):
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if self.tool is not None:
                    function = {"name": self.tool, "arguments": content}
                    message = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{**self.call, "function": function}],
                    }
                choice: dict[str, Any] = {
                    "index": index,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._finish(finish),
                }
            else:
                choice = {
                    "index": index,
                    "text": content,
                    "logprobs": None,
                    "finish_reason": finish,
                }
            choices.append(choice)
        base = {**self.base, "object": "chat.completion" if self.chat else "text_completion"}
        base.pop("usage", None)
        return {**base, "choices": choices, "usage": self.usage}

    def _choice(self, tok: str, finish_reason: str | None = None) -> bytes:
        out = []
        for index in range(self.choices):
            if self.chat:
                delta: dict[str, Any] = {"content": tok} if finish_reason is None else {}
                if self.tool is not None and finish_reason is None:
                    delta = {"tool_calls": [{"index": 0, "function": {"arguments": tok}}]}
                choice: dict[str, Any] = {
                    "index": index,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            else:
                choice = {
                    "index": index,
                    "text": tok,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            out.append(_event(None, {**self.base, "choices": [choice]}))
        return b"".join(out)

    def start(self) -> list[bytes]:
        if not self.chat:
            return []
        role: dict[str, Any] = {"role": "assistant", "content": ""}
        if self.tool is not None:
            function = {"name": self.tool, "arguments": ""}
            role = {
                **role,
                "content": None,
                "tool_calls": [{"index": 0, **self.call, "function": function}],
            }
        return [
            _event(
                None,
                {
                    **self.base,
                    "choices": [
                        {"index": index, "delta": role, "logprobs": None, "finish_reason": None}
                    ],
                },
            )
            for index in range(self.choices)
        ]

    def token(self, text: str) -> bytes:
        return self._choice(text)

    def end(self, content: str, finish: str) -> list[bytes]:
        out = [self._choice("", self._finish(finish))]
        if self.stream_usage:
            out.append(_event(None, {**self.base, "choices": [], "usage": self.usage}))
        out.append(b"data: [DONE]\n\n")
        return out

    def error(self, kind: str, name: str, failed: bool) -> list[bytes]:
        """vLLM's failure inside a stream: an error object (its HTTP status as the code)."""
        status, kind_type, _, _ = ERRORS[kind]
        error = {"message": _said(kind, name), "type": kind_type, "param": None, "code": status}
        return [_event(None, {"error": error}), b"data: [DONE]\n\n"]


class Responses:
    """OpenAI's Responses API, as vLLM (numbered events) or llama-server renders it."""

    def __init__(
        self, ident: str, model: str, created: int, usage: dict[str, int], numbered: bool
    ) -> None:
        self.id = "resp_" + ident
        self.item = "msg_" + ident
        self.model = model
        self.created = created
        self.usage = {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        }
        self.numbered = numbered
        self.sequence = 0

    def _status(self, finish: str) -> str:
        # llama-server says completed whatever stopped it; vLLM says incomplete at the limit.
        return "incomplete" if finish == "length" and self.numbered else "completed"

    def _message(self, content: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": content, "annotations": []}
        return {
            "type": "message",
            "id": self.item,
            "role": "assistant",
            "status": status,
            "content": [part] if content or status != "in_progress" else [],
        }

    def _response(self, status: str, content: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "output": [] if content is None else [self._message(content, "completed")],
        }
        if content is not None:
            out["usage"] = self.usage
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out

    def body(self, content: str, finish: str) -> dict[str, Any]:
        return self._response(self._status(finish), content)

    def _emit(self, name: str, payload: dict[str, Any]) -> bytes:
        payload = {"type": name, **payload}
        if self.numbered:
            payload["sequence_number"] = self.sequence
            self.sequence += 1
        return _event(name, payload)

    def start(self) -> list[bytes]:
        created = self._response("in_progress", None)
        return [
            self._emit("response.created", {"response": created}),
            self._emit("response.in_progress", {"response": created}),
            self._emit(
                "response.output_item.added",
                {"output_index": 0, "item": self._message("", "in_progress")},
            ),
            self._emit(
                "response.content_part.added",
                {
                    "item_id": self.item,
                    "output_index": 0,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                },
            ),
        ]

    def token(self, text: str) -> bytes:
        return self._emit(
            "response.output_text.delta",
            {"item_id": self.item, "output_index": 0, "content_index": 0, "delta": text},
        )

    def end(self, content: str, finish: str) -> list[bytes]:
        status = self._status(finish)
        where = {"item_id": self.item, "output_index": 0, "content_index": 0}
        part = {"type": "output_text", "text": content, "annotations": []}
        final = self._response(status, content)
        terminal = "response.incomplete" if status == "incomplete" else "response.completed"
        return [
            self._emit("response.output_text.done", {**where, "text": content}),
            self._emit("response.content_part.done", {**where, "part": part}),
            self._emit(
                "response.output_item.done",
                {"output_index": 0, "item": self._message(content, "completed")},
            ),
            self._emit(terminal, {"response": final}),
        ]

    def error(self, kind: str, name: str, failed: bool) -> list[bytes]:
        """OpenAI's `error` event (its fields at the top), or `response.failed`: the response
        failed, its `error` saying why."""
        code = ERRORS[kind][2]
        if not failed:
            return [
                self._emit("error", {"code": code, "message": _said(kind, name), "param": None})
            ]
        response = {
            **self._response("failed", None),
            "error": {"code": code, "message": _said(kind, name)},
        }
        return [self._emit("response.failed", {"response": response})]


class Messages:
    """Anthropic's Messages API."""

    def __init__(
        self, ident: str, model: str, usage: dict[str, int], stop_sequence: str | None = None
    ) -> None:
        self.id = "msg_" + ident
        self.model = model
        self.input_tokens = usage["prompt_tokens"]
        self.output_tokens = usage["completion_tokens"]
        # The request's stop sequence the answer ended at, if one.
        self.stop_sequence = stop_sequence

    def _message(
        self, content: list[dict[str, Any]], stop: str | None, output: int = 0
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.model,
            "stop_reason": stop,
            "stop_sequence": self.stop_sequence if stop == "stop_sequence" else None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": output},
        }

    def _stop(self, finish: str) -> str:
        if finish == "length":
            return "max_tokens"
        return "stop_sequence" if self.stop_sequence is not None else "end_turn"

    def body(self, content: str, finish: str) -> dict[str, Any]:
        blocks = [{"type": "text", "text": content}]
        return self._message(blocks, self._stop(finish), self.output_tokens)

    def start(self) -> list[bytes]:
        return [
            _event(
                "message_start", {"type": "message_start", "message": self._message([], None, 0)}
            ),
            _event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
        ]

    def token(self, text: str) -> bytes:
        delta = {"type": "text_delta", "text": text}
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )

    def end(self, content: str, finish: str) -> list[bytes]:
        reason = self._stop(finish)
        said = self.stop_sequence if reason == "stop_sequence" else None
        delta = {"stop_reason": reason, "stop_sequence": said}
        return [
            _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": delta,
                    "usage": {"output_tokens": self.output_tokens},
                },
            ),
            _event("message_stop", {"type": "message_stop"}),
        ]

    def error(self, kind: str, name: str, failed: bool) -> list[bytes]:
        """Anthropic's `error` event: `{"type": "error", "error": {"type", "message"}}`."""
        error = {"type": ERRORS[kind][3], "message": _said(kind, name)}
        return [_event("error", {"type": "error", "error": error})]


def _text(content: Any) -> str:
    """A message content's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and "text" in p)
    return ""


def item_reference(item: Any) -> str | None:
    """The id a Responses input item refers to (`item_reference`, whose type may be left out),
    else None."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        return None
    kind = item.get("type")
    return item["id"] if kind == "item_reference" or (kind is None and "role" not in item) else None


def responses_messages(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A Responses request's input as chat messages (None when there is no usable input)."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        return None
    for item in items:
        if isinstance(item, dict) and "role" in item:
            messages.append({"role": item["role"], "content": _text(item.get("content"))})
    return messages or None


def anthropic_messages(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A Messages request as chat messages (None when `messages` is not a list)."""
    items = body.get("messages")
    if not isinstance(items, list):
        return None
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system)})
    for item in items:
        if isinstance(item, dict):
            messages.append({"role": item.get("role"), "content": _text(item.get("content"))})
    return messages
