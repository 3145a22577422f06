"""The simulated region: an OpenAI-compatible aiohttp server with injected latency and faults."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import re
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from router.sim import apis, text

FAIL_MODES = (
    "none",
    "refuse",
    "500",
    "503",
    "429",
    "hang",
    "die-mid-stream",
    "drip",
    # A stream that ends in the API's own error event after `after_tokens` tokens (0: before
    # any): chat vLLM's `data: {"error": ...}` and [DONE], the Responses API's `event: error`,
    # the Messages API's `event: error`; failed-event is `response.failed` on the Responses
    # API (the error event elsewhere). A whole answer gets the error's status instead.
    "error-event",
    "failed-event",
)
# Whose fault the error of error-event / failed-event is (apis.ERRORS has each API's words).
ERROR_KINDS = ("server", "overloaded", "rate_limit", "invalid_request")
# Server kinds the sim can behave like, with the quirks of the real ones (tests/real pins them):
# vllm      continues a trailing assistant message (chat: only with continue_final_message, else
#           it opens a new turn after it); honours stream_options.include_usage.
# llama-server  the same, but answers the prefill back first, in one event with the first new
#           token; reads its own `n_predict` before max_completion_tokens / max_tokens (a
#           negative one: no limit); streams its own `n_cmpl` choices interleaved; without a
#           vision model (`multimodal`) an image or audio part is a 500 server_error, as its
#           request errors are.
# Every kind ends a chat or completions answer where the first of the request's `stop` strings
# completes in what it generated (finish_reason "stop"; Messages: `stop_sequences`, stop_reason
# "stop_sequence"); its tokens go out as they come, so one that began the stop string was sent
# already (vLLM and llama.cpp hold such text back).
# Every kind answers a chat request with `tools` and a `tool_choice` of "required" (or naming a
# function) with a call of that function, its arguments streamed as the tokens; and sends a
# stream's finish_reason in a chunk of its own after the last token (die-mid-stream with
# `after_tokens` equal to the answer's length cuts between them).
# llama-cpp-python  refuses a non-UUID X-Request-Id with an empty 400; opens a new turn after a
#           trailing assistant message; ignores include_usage; a new request interrupts a running
#           stream (ended with [DONE] and no finish_reason); request errors (a role or
#           response_format it does not take, a missing field) are 500 internal_server_error
#           quoting FastAPI's check; a streamed prompt over its context is a 200 with an empty
#           body; it has no /health (its /docs page answers the router's probes).
KINDS = ("vllm", "llama-server", "llama-cpp-python")
# How its streams end their SSE lines (`sse_line_end`): each is legal SSE, and a region may use
# any (lf: what the real servers send).
LINE_ENDS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
# Which SSE fields besides `data:` its streams carry (`sse_fields`): none (what vLLM and
# llama.cpp send), or all: a comment and a `retry:` first, an `id:` on every event and an
# `event: message` on each that has no name of its own (chat, completions), as servers built on
# sse-starlette and some hosted OpenAI-compatible APIs send.
SSE_FIELDS = ("none", "all")
# The sim's context, for llama-cpp-python's streamed overflow: prompts longer are refused.
_CONTEXT_CHARS = 16_000
_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$", re.I)
# "hang" holds a request this long at most, so a forgotten client cannot pin a task forever.
_HANG_S = 600.0
# Responses a vllm-kind sim keeps for later reads.
_STORED = 1000
_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()


class SimOptions(msgspec.Struct, kw_only=True):
    """Behaviour of the region; flags set it at start, POST /sim/config changes it live."""

    name: str = "sim"
    models: tuple[str, ...] = ("sim-1",)
    rtt_ms: float = 0.0
    ttft_ms: float = 0.0
    # 0 means as fast as possible.
    tokens_per_s: float = 0.0
    fail_mode: str = "none"
    # For die-mid-stream / hang / error-event / failed-event: how many tokens go out first.
    after_tokens: int = 3
    # For error-event / failed-event: whose fault the error is (ERROR_KINDS).
    error_kind: str = "server"
    # For drip: the pause between tokens (stream) or body pieces (non-stream).
    drip_ms: float = 1000.0
    embedding_dims: int = 16
    # Which real server to behave like (KINDS).
    kind: str = "vllm"
    # Takes image and audio parts (llama-server started with a vision model's mmproj).
    multimodal: bool = False
    # Models it does not serve (a region whose config drifted from the router's): a request
    # for one is answered as vLLM answers a model it was not started with, a 404.
    unserved: tuple[str, ...] = ()
    # How its streams end SSE lines (LINE_ENDS): lf, crlf, or cr (a lone CR).
    sse_line_end: str = "lf"
    # The SSE fields its streams carry besides `data:` (SSE_FIELDS).
    sse_fields: str = "none"


class SimStats(msgspec.Struct):
    """Counters exposed at GET /sim/stats; tests prove cancellation and failover with them."""

    requests: int = 0
    active: int = 0
    completed: int = 0
    # Requests whose client went away before the sim finished answering.
    cancelled: int = 0
    injected_failures: int = 0
    streams: int = 0
    tokens_sent: int = 0
    # GET /health answered (the router's probes).
    probes: int = 0
    by_path: dict[str, int] = msgspec.field(default_factory=dict)
    last_headers: dict[str, str] = msgspec.field(default_factory=dict)
    last_body: str = ""


class _Plan(msgspec.Struct, kw_only=True):
    """One request's behaviour after applying per-request headers to the options."""

    fail: str
    rtt_s: float
    ttft_s: float
    token_s: float
    after_tokens: int
    drip_s: float
    # Test aid for backpressure: spaces appended to every streamed token.
    pad: int = 0
    error_kind: str = "server"


@dataclass(slots=True)
class _Stored:
    """A response the sim keeps (as vLLM does): itself, its input, and how to stream it again."""

    response: dict[str, Any]
    given: Any
    replay: Callable[[], apis.Responses]
    tokens: list[str]
    finish: str


def _plan(options: SimOptions, headers: Mapping[str, str]) -> _Plan:
    """Options overridden by x-sim-* headers; faults only if x-sim-only (if present) names us."""
    only = headers.get("x-sim-only")
    targeted = only is None or options.name in {n.strip() for n in only.split(",")}
    fail = options.fail_mode
    if targeted and "x-sim-fail" in headers:
        fail = headers["x-sim-fail"]
    tps = float(headers.get("x-sim-tokens-per-s", options.tokens_per_s))
    return _Plan(
        fail=fail,
        rtt_s=float(headers.get("x-sim-rtt-ms", options.rtt_ms)) / 1000,
        ttft_s=float(headers.get("x-sim-ttft-ms", options.ttft_ms)) / 1000,
        token_s=1 / tps if tps > 0 else 0.0,
        after_tokens=int(headers.get("x-sim-after-tokens", options.after_tokens)),
        drip_s=float(headers.get("x-sim-drip-ms", options.drip_ms)) / 1000,
        pad=int(headers.get("x-sim-pad-bytes", 0)),
        error_kind=headers.get("x-sim-error-kind", options.error_kind),
    )


def _error(status: int, message: str, kind: str) -> web.Response:
    body = _ENCODE.encode(
        {"error": {"message": message, "type": kind, "param": None, "code": None}}
    )
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _no_model(model: str) -> web.Response:
    """vLLM's answer to a model it does not serve (OpenAIServing._check_model): a 404 in
    OpenAI's error shape, type NotFoundError."""
    error = {
        "message": f"The model `{model}` does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    return web.Response(
        status=404, body=_ENCODE.encode({"error": error}), content_type="application/json"
    )


def _lcp_refusal(*errors: tuple[str, tuple[object, ...], str, object]) -> web.Response:
    """llama-cpp-python's answer to a request body FastAPI's check refused: its route handler
    turns the check's errors, (type, loc, msg, input) each, into a 500 internal_server_error
    quoting them (llama_cpp/server/errors.py)."""
    lines = "".join(
        f"\n  {{'type': {kind!r}, 'loc': {loc!r}, 'msg': {msg!r}, 'input': {value!r}}}"
        for kind, loc, msg, value in errors
    )
    count = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''}:"
    error = {"message": count + lines + "\n", "type": "internal_server_error"}
    body = _ENCODE.encode({"error": {**error, "param": None, "code": None}})
    return web.Response(status=500, body=body, content_type="application/json")


# The roles llama-cpp-python's chat request takes, and the response formats.
_LCP_ROLES = ("system", "user", "assistant", "tool", "function")
_LCP_FORMATS = ("text", "json_object")


def _lcp_check(body: dict[str, Any]) -> web.Response | None:
    """llama-cpp-python's check of a chat body: a role or response_format it does not take."""
    for i, message in enumerate(body.get("messages") or ()):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _LCP_ROLES:
            loc = ("body", "messages", i, "role")
            return _lcp_refusal(
                *(("literal_error", loc, f"Input should be {r!r}", role) for r in _LCP_ROLES)
            )
    form = body.get("response_format")
    kind = form.get("type") if isinstance(form, dict) else None
    if form is not None and kind not in _LCP_FORMATS:
        msg = "Input should be 'text' or 'json_object'"
        return _lcp_refusal(("literal_error", ("body", "response_format", "type"), msg, kind))
    return None


def _tool_called(body: dict[str, Any]) -> str | None:
    """The function a chat request makes the answer call: with `tools`, a `tool_choice` of
    "required" (the first tool) or naming one; None: a text answer."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name")
        return named if isinstance(named, str) else None
    if choice != "required":
        return None
    first = tools[0].get("function") if isinstance(tools[0], dict) else None
    name = first.get("name") if isinstance(first, dict) else None
    return name if isinstance(name, str) else "tool"


def _split(text: str, pieces: int) -> list[str]:
    """`text` in `pieces` pieces (at least one), as even as can be."""
    pieces = max(1, min(pieces, len(text)))
    size, extra = divmod(len(text), pieces)
    out, at = [], 0
    for i in range(pieces):
        step = size + (1 if i < extra else 0)
        out.append(text[at : at + step])
        at += step
    return out


def _llama_server_error(message: str) -> web.Response:
    """llama-server's answer to a request it could not read: a 500 in its own error shape."""
    body = _ENCODE.encode({"error": {"code": 500, "message": message, "type": "server_error"}})
    return web.Response(status=500, body=body, content_type="application/json")


def _media_part(messages: list[Any]) -> str | None:
    """The first media kind ("image", "audio") among the messages' content parts, if any."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image_url", "input_image", "image"):
                return "image"
            if kind in ("input_audio", "audio"):
                return "audio"
    return None


class _Dropped(Exception):
    """The sim dropped the connection on purpose (not a client cancellation)."""


def _reframed(
    write: Callable[[bytes], Awaitable[None]], eol: bytes
) -> Callable[[bytes], Awaitable[None]]:
    """`write` with the LF ending every line of the sim's events replaced by `eol` (their
    JSON holds no raw newline)."""

    async def reframed(data: bytes) -> None:
        await write(data.replace(b"\n", eol))

    return reframed


def _fielded(
    write: Callable[[bytes], Awaitable[None]], name: str
) -> Callable[[bytes], Awaitable[None]]:
    """`write` with the fields of `sse_fields` all: a comment and a `retry:` event before the
    first events, an `id:` line (1, 2, ...) on every event and `event: message` on each that
    names none (the sim's events are whole, their lines ended by LF)."""
    ids = 0

    async def fielded(data: bytes) -> None:
        nonlocal ids
        out = [b": sim region " + name.encode() + b"\n\nretry: 3000\n\n"] if not ids else []
        for event in data.split(b"\n\n")[:-1]:
            ids += 1
            head = b"" if event.startswith(b"event:") else b"event: message\n"
            out.append(head + b"id: %d\n" % ids + event + b"\n\n")
        await write(b"".join(out))

    return fielded


async def _pause(seconds: float) -> None:
    """Wait at least `seconds`: an injected delay is a lower bound the tests rely on, and the
    event loop's timers (whole milliseconds, from a clock read at the start of the loop's
    iteration) may fire up to a millisecond early."""
    if seconds <= 0:
        return
    until = time.monotonic() + seconds
    # A deadline, not a condition to poll: no Event could say when the time is up.
    while (left := until - time.monotonic()) > 0:  # noqa: ASYNC110
        await asyncio.sleep(left)


class SimRegion:
    """State and handlers of one simulated region."""

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.stats = SimStats()
        self.created = int(time.time())
        # llama-cpp-python: the running stream a new request interrupts.
        self._running: asyncio.Event | None = None
        # Responses stored for later reads (the vllm kind), least recently made first out.
        # id -> (the response, its input, a replay of its stream: GET ...?stream=true)
        self._stored: OrderedDict[str, _Stored] = OrderedDict()
        # The output items of those responses, by id (an input's `item_reference`).
        self._items: dict[str, dict[str, Any]] = {}

    # ---- fault injection shared by every generating endpoint ----

    async def _pre_fault(
        self, request: web.Request, plan: _Plan, stream: bool
    ) -> web.Response | None:
        """Faults that strike before the first byte; None when the request should proceed."""
        fail = plan.fail
        if fail == "none":
            return None
        if fail not in FAIL_MODES:
            return _error(400, f"unknown x-sim-fail {fail!r}; one of {FAIL_MODES}", "invalid")
        if fail in ("die-mid-stream", "drip") or (fail == "hang" and stream and plan.after_tokens):
            return None
        if fail in ("error-event", "failed-event"):
            if plan.error_kind not in ERROR_KINDS:
                return _error(400, f"unknown x-sim-error-kind; one of {ERROR_KINDS}", "invalid")
            if stream:
                return None
            self.stats.injected_failures += 1
            status, kind, _, _ = apis.ERRORS[plan.error_kind]
            return _error(status, f"sim region {self.options.name}: injected {kind}", kind)
        self.stats.injected_failures += 1
        if fail == "refuse":
            # The closest a running server gets to refusing: drop the connection unanswered.
            assert request.transport is not None
            request.transport.abort()
            raise _Dropped
        if fail == "hang":
            await asyncio.sleep(_HANG_S)
            return _error(504, "sim hang elapsed", "server_error")
        status = int(fail)
        kind = "rate_limit_error" if status == 429 else "server_error"
        return _error(status, f"sim region {self.options.name}: injected {status}", kind)

    # ---- endpoints ----

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "responses")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "messages")

    async def _generate(self, request: web.Request, api: str) -> web.StreamResponse:
        stats = self.stats
        stats.requests += 1
        stats.by_path[request.path] = stats.by_path.get(request.path, 0) + 1
        stats.active += 1
        try:
            response = await self._generate_inner(request, api)
        except _Dropped:
            raise asyncio.CancelledError from None
        except (asyncio.CancelledError, ConnectionResetError):
            stats.cancelled += 1
            raise
        finally:
            stats.active -= 1
        stats.completed += 1
        return response

    async def _generate_inner(self, request: web.Request, api: str) -> web.StreamResponse:
        raw = await request.read()
        self.stats.last_headers = dict(request.headers)
        self.stats.last_body = raw.decode("utf-8", "replace")
        kind = self.options.kind
        lcp = kind == "llama-cpp-python"
        if lcp and api in ("responses", "messages"):
            # FastAPI's answer for a route it does not have.
            return web.json_response({"detail": "Not Found"}, status=404)
        if lcp:
            rid = request.headers.get("X-Request-Id")
            if rid and not _UUID.match(rid.strip("{}").removeprefix("urn:uuid:")):
                return web.Response(status=400)  # starlette_context: empty body, no reason
            if self._running is not None:
                self._running.set()  # interrupt_requests: the running stream stops now
        bad = 500 if lcp else 400
        try:
            body = _DECODE.decode(raw)
        except msgspec.DecodeError:
            if lcp:
                return _lcp_refusal(("json_invalid", ("body", 0), "JSON decode error", {}))
            return _error(bad, "invalid JSON", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            if lcp:
                return _lcp_refusal(("missing", ("body", "model"), "Field required", body))
            return _error(bad, "`model` is required", "invalid_request_error")
        if lcp and api == "chat":
            refused = _lcp_check(body)
            if refused is not None:
                return refused
        model: str = body["model"]
        if model in self.options.unserved:
            return _no_model(model)
        plan = _plan(self.options, request.headers)
        stream = bool(body.get("stream"))
        fault = await self._pre_fault(request, plan, stream)
        if fault is not None:
            return fault
        await _pause(plan.rtt_s)
        # llama-server's echo of a prefill: sent first, counted in neither limit nor usage.
        echo = ""
        if api == "completions":
            prompt = body.get("prompt", "")
            tokens = text.completion_tokens(model, prompt)
            prompt_tokens = text.count_prompt_tokens(prompt)
        else:
            if api == "chat":
                messages = body.get("messages")
                if not isinstance(messages, list):
                    messages = None
            elif api == "responses":
                previous = body.get("previous_response_id")
                if previous is not None and kind == "llama-server":
                    return _error(
                        400,
                        "llama.cpp does not support 'previous_response_id'.",
                        "invalid_request_error",
                    )
                if previous is not None and previous not in self._stored:
                    # Only the region that made a response has it.
                    return _error(
                        404,
                        f"Previous response with id '{previous}' not found.",
                        "invalid_request_error",
                    )
                items = body.get("input")
                if isinstance(items, list):
                    # An item_reference is to an item stored here: found, or a 404.
                    for item in items:
                        ref = apis.item_reference(item)
                        if ref is not None and ref not in self._items:
                            return _error(
                                404, f"Item with id '{ref}' not found.", "invalid_request_error"
                            )
                    resolved = [self._items.get(apis.item_reference(i) or "", i) for i in items]
                    messages = apis.responses_messages({**body, "input": resolved})
                else:
                    messages = apis.responses_messages(body)
            else:
                messages = apis.anthropic_messages(body)
            if messages is None:
                field = "input" if api == "responses" else "messages"
                if lcp:
                    return _lcp_refusal(("missing", ("body", field), "Field required", body))
                return _error(bad, f"`{field}` is required", "invalid_request_error")
            media = None if self.options.multimodal else _media_part(messages)
            if media is not None and kind == "llama-server":
                return _llama_server_error(
                    f"{media} input is not supported - hint: if this is unexpected, you may "
                    "need to provide the mmproj"
                )
            if lcp and messages and messages[-1].get("role") == "assistant":
                # It closes the prefill and opens a new turn: no continuation.
                messages = [*messages, {"role": "assistant", "content": "(new turn)"}]
            # vLLM's chat continues a trailing assistant message only when asked to
            # (continue_final_message); otherwise it opens a new turn after it.
            new_turn = (
                api == "chat" and kind == "vllm" and body.get("continue_final_message") is not True
            )
            tokens, prefill = text.chat_tokens(model, messages, continues=not new_turn)
            if prefill and kind == "llama-server":
                echo = messages[-1]["content"]  # the prefill, answered back first
            prompt_tokens = text.count_prompt_tokens(messages)
            if lcp and stream and len(raw) > _CONTEXT_CHARS:
                # Over its context: llama-cpp-python fails after its headers, with no event.
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                await resp.write_eof()
                return resp
        limit = body.get(
            "max_output_tokens"
            if api == "responses"
            else "max_tokens"
            if api == "messages"
            else "max_completion_tokens",
            body.get("max_tokens"),
        )
        n_predict = body.get("n_predict")
        if kind == "llama-server" and isinstance(n_predict, int):
            # llama-server reads its own n_predict first (the others are its aliases); a
            # negative one is no limit at all.
            limit = n_predict if n_predict >= 0 else None
        finish = "stop"
        if isinstance(limit, int) and 0 <= limit < len(tokens):
            tokens = tokens[:limit]
            finish = "length"
        stop = body.get("stop_sequences" if api == "messages" else "stop")
        stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
        # The stop string the answer ended at (Messages' stop_sequence).
        hit = None
        if api != "responses" and stops:
            tokens, hit = text.stopped(tokens, [s for s in stops if isinstance(s, str)])
            finish = "stop" if hit is not None else finish
        generated = len(tokens)
        tool = _tool_called(body) if api == "chat" else None
        if tool is not None:
            # The call's arguments, a JSON object holding the text, streamed in as many pieces.
            tokens = _split(_ENCODE.encode({"text": "".join(tokens)}).decode(), generated)
        # llama-server's own `n_cmpl`: that many answers (the same text here), interleaved.
        n_cmpl = body.get("n_cmpl")
        choices = n_cmpl if kind == "llama-server" and type(n_cmpl) is int and n_cmpl > 1 else 1
        if echo:
            # As llama-server does: the echo and the first new token in one event.
            tokens = [echo + tokens[0], *tokens[1:]] if tokens else [echo]
        seed = hashlib.sha256(raw).hexdigest()[:24]
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated * choices,
            "total_tokens": prompt_tokens + generated * choices,
        }
        render: apis.Render
        if api == "responses":
            render = apis.Responses(seed, model, self.created, usage, numbered=kind == "vllm")
        elif api == "messages":
            render = apis.Messages(seed, model, usage, hit)
        else:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            ident = ("chatcmpl-" if api == "chat" else "cmpl-") + seed
            render = apis.Chat(
                api == "chat",
                ident,
                model,
                self.created,
                usage,
                include_usage and not lcp,
                choices,
                tool,
            )
        if (
            isinstance(render, apis.Responses)
            and body.get("store") is not False
            and kind != ("llama-server")
        ):
            # vLLM keeps the response for GET /v1/responses/{id} and previous_response_id.
            replay = functools.partial(
                apis.Responses, seed, model, self.created, usage, numbered=kind == "vllm"
            )
            made = render.body("".join(tokens), finish)
            self._store(render.id, _Stored(made, body.get("input"), replay, tokens, finish))
        if stream:
            return await self._stream(request, plan, render, tokens, finish)
        await _pause(plan.ttft_s + plan.token_s * len(tokens))
        payload = _ENCODE.encode(render.body("".join(tokens), finish))
        self.stats.tokens_sent += len(tokens)
        if plan.fail in ("die-mid-stream", "drip"):
            return await self._broken_body(request, plan, payload)
        return web.Response(body=payload, content_type="application/json")

    async def _broken_body(
        self, request: web.Request, plan: _Plan, payload: bytes
    ) -> web.StreamResponse:
        """A non-stream body that dies half way or trickles out in small pieces."""
        self.stats.injected_failures += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = len(payload)
        await resp.prepare(request)
        if plan.fail == "die-mid-stream":
            await resp.write(payload[: len(payload) // 2])
            assert request.transport is not None
            request.transport.abort()
            return resp
        for i in range(0, len(payload), 16):
            await resp.write(payload[i : i + 16])
            await asyncio.sleep(plan.drip_s)
        await resp.write_eof()
        return resp

    async def _stream(
        self,
        request: web.Request,
        plan: _Plan,
        render: apis.Render,
        tokens: list[str],
        finish: str,
    ) -> web.StreamResponse:
        self.stats.streams += 1
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        eol = LINE_ENDS[self.options.sse_line_end]
        # Every event the stream writes, its lines ended the region's way.
        write = resp.write if eol == b"\n" else _reframed(resp.write, eol)
        if self.options.sse_fields == "all":
            write = _fielded(write, self.options.name)
        await _pause(plan.ttft_s)
        start = render.start()
        if start:
            await write(b"".join(start))
        fail = plan.fail
        pause = plan.drip_s if fail == "drip" else plan.token_s
        if fail == "drip":
            self.stats.injected_failures += 1
        interrupted = asyncio.Event()
        if self.options.kind == "llama-cpp-python":
            self._running = interrupted
        for i, tok in enumerate(tokens):
            if i and pause:
                await asyncio.sleep(pause)
            if interrupted.is_set():
                # Cut by a newer request: [DONE] right after the last token, no finish_reason.
                await write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            if i == plan.after_tokens and fail in ("error-event", "failed-event"):
                return await self._error_end(resp, plan, render, write)
            if i == plan.after_tokens and fail in ("die-mid-stream", "hang"):
                self.stats.injected_failures += 1
                if fail == "hang":
                    await asyncio.sleep(_HANG_S)
                assert request.transport is not None
                request.transport.abort()
                return resp
            await write(render.token(tok + " " * plan.pad if plan.pad else tok))
            self.stats.tokens_sent += 1
        if plan.after_tokens == len(tokens) and fail == "die-mid-stream":
            # Cut after the last token, before the chunk that says why it ended (llama-server
            # sends its finish_reason in one of its own).
            self.stats.injected_failures += 1
            assert request.transport is not None
            request.transport.abort()
            return resp
        if fail in ("error-event", "failed-event"):
            # Fewer tokens than after_tokens.
            return await self._error_end(resp, plan, render, write)
        await write(b"".join(render.end("".join(tokens), finish)))
        await resp.write_eof()
        return resp

    async def _error_end(
        self,
        resp: web.StreamResponse,
        plan: _Plan,
        render: apis.Render,
        write: Callable[[bytes], Awaitable[None]],
    ) -> web.StreamResponse:
        """End a stream with the API's own error event, the connection closed cleanly."""
        self.stats.injected_failures += 1
        failed = plan.fail == "failed-event"
        await write(b"".join(render.error(plan.error_kind, self.options.name, failed)))
        await resp.write_eof()
        return resp

    async def count(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/responses/input_tokens and /v1/messages/count_tokens: the prompt's tokens,
        as the same request's usage would say."""
        stats = self.stats
        stats.requests += 1
        stats.by_path[request.path] = stats.by_path.get(request.path, 0) + 1
        stats.last_headers = dict(request.headers)
        if self.options.kind == "llama-cpp-python":
            return web.json_response({"detail": "Not Found"}, status=404)
        try:
            body = _DECODE.decode(await request.read())
        except msgspec.DecodeError:
            return _error(400, "invalid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "expected a JSON object", "invalid_request_error")
        anthropic = request.path.endswith("/count_tokens")
        messages = (apis.anthropic_messages if anthropic else apis.responses_messages)(body)
        if messages is None:
            return _error(400, "nothing to count", "invalid_request_error")
        counted: dict[str, Any] = {"input_tokens": text.count_prompt_tokens(messages)}
        if not anthropic:
            counted["object"] = "response.input_tokens"
        stats.completed += 1
        return web.Response(body=_ENCODE.encode(counted), content_type="application/json")

    def _store(self, response_id: str, made: _Stored) -> None:
        stored = self._stored
        stored[response_id] = made
        for item in made.response.get("output", ()):
            self._items[item["id"]] = item
        while len(stored) > _STORED:
            _, gone = stored.popitem(last=False)
            for item in gone.response.get("output", ()):
                self._items.pop(item["id"], None)

    async def stored(self, request: web.Request) -> web.StreamResponse:
        """GET / DELETE /v1/responses/{id}, POST .../cancel, GET .../input_items."""
        self.stats.by_path[request.path] = self.stats.by_path.get(request.path, 0) + 1
        self.stats.last_headers = dict(request.headers)
        found = self._stored.get(request.match_info["id"])
        if found is None:
            return _error(404, "Response not found.", "invalid_request_error")
        response, given = found.response, found.given
        if request.method == "DELETE":
            del self._stored[response["id"]]
            for item in response.get("output", ()):
                self._items.pop(item["id"], None)
            payload: Any = {"id": response["id"], "object": "response", "deleted": True}
        elif request.path.endswith("/input_items"):
            items = [{"role": "user", "content": given}] if isinstance(given, str) else given
            payload = {"object": "list", "data": items or []}
        else:
            # The response again, whole or (?stream=true) as its stream; faults apply to both.
            plan = _plan(self.options, request.headers)
            if request.query.get("stream") == "true":
                return await self._stream(request, plan, found.replay(), found.tokens, found.finish)
            if plan.fail in ("die-mid-stream", "drip"):
                return await self._broken_body(request, plan, _ENCODE.encode(response))
            payload = response
        return web.Response(body=_ENCODE.encode(payload), content_type="application/json")

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        stats = self.stats
        stats.requests += 1
        stats.by_path[request.path] = stats.by_path.get(request.path, 0) + 1
        try:
            body = _DECODE.decode(await request.read())
        except msgspec.DecodeError:
            return _error(400, "invalid JSON", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _error(400, "`model` is required", "invalid_request_error")
        if body["model"] in self.options.unserved:
            return _no_model(body["model"])
        plan = _plan(self.options, request.headers)
        try:
            fault = await self._pre_fault(request, plan, False)
        except _Dropped:
            raise asyncio.CancelledError from None
        if fault is not None:
            return fault
        await _pause(plan.rtt_s)
        model: str = body["model"]
        inputs = body.get("input")
        items = (
            inputs
            if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int)
            else [inputs]
        )
        dims = body.get("dimensions") or self.options.embedding_dims
        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, item in enumerate(items):
            vector = text.embedding(model, item, int(dims))
            value: Any = (
                base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
                if b64
                else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": value})
        prompt_tokens = text.count_prompt_tokens(inputs)
        payload = {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
        stats.completed += 1
        return web.Response(body=_ENCODE.encode(payload), content_type="application/json")

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "created": self.created, "owned_by": self.options.name}
            for m in self.options.models
            if m not in self.options.unserved
        ]
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.StreamResponse:
        if (request.path == "/docs") != (self.options.kind == "llama-cpp-python"):
            # llama-cpp-python (FastAPI) has no /health; the router probes its /docs page.
            return web.json_response({"detail": "Not Found"}, status=404)
        self.stats.probes += 1
        # Only the region-wide mode affects health: per-request headers model one bad request.
        fail = self.options.fail_mode
        if fail in ("500", "503", "429"):
            return _error(int(fail), "unhealthy", "server_error")
        if fail == "hang":
            await asyncio.sleep(_HANG_S)
        if fail == "refuse":
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError
        await _pause(self.options.rtt_ms / 1000)
        if request.path == "/docs":
            return web.Response(text="<!DOCTYPE html><title>FastAPI - Swagger UI</title>")
        return web.json_response({"status": "ok", "name": self.options.name})

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.Response(body=_ENCODE.encode(self.stats), content_type="application/json")

    async def reset_stats(self, request: web.Request) -> web.Response:
        self.stats = SimStats()
        return web.Response(body=_ENCODE.encode(self.stats), content_type="application/json")

    async def get_config(self, request: web.Request) -> web.Response:
        return web.Response(body=_ENCODE.encode(self.options), content_type="application/json")

    async def set_config(self, request: web.Request) -> web.Response:
        """Merge a JSON object of SimOptions fields into the live options."""
        try:
            changes = _DECODE.decode(await request.read())
            merged = msgspec.convert({**msgspec.to_builtins(self.options), **changes}, SimOptions)
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as exc:
            return _error(400, f"bad sim config: {exc}", "invalid_request_error")
        if merged.fail_mode not in FAIL_MODES:
            return _error(400, f"fail_mode must be one of {FAIL_MODES}", "invalid_request_error")
        if merged.error_kind not in ERROR_KINDS:
            return _error(400, f"error_kind must be one of {ERROR_KINDS}", "invalid_request_error")
        if merged.sse_line_end not in LINE_ENDS:
            message = f"sse_line_end must be one of {tuple(LINE_ENDS)}"
            return _error(400, message, "invalid_request_error")
        if merged.sse_fields not in SSE_FIELDS:
            message = f"sse_fields must be one of {SSE_FIELDS}"
            return _error(400, message, "invalid_request_error")
        self.options = merged
        return web.Response(body=_ENCODE.encode(merged), content_type="application/json")


SIM: web.AppKey[SimRegion] = web.AppKey("sim")


def build_sim_app(options: SimOptions) -> web.Application:
    """The aiohttp app of one simulated region."""
    sim = SimRegion(options)
    app = web.Application(client_max_size=64 << 20)
    app[SIM] = sim
    app.router.add_post("/v1/chat/completions", sim.chat)
    app.router.add_post("/v1/completions", sim.completions)
    app.router.add_post("/v1/embeddings", sim.embeddings)
    app.router.add_post("/v1/responses", sim.responses)
    app.router.add_post("/v1/messages", sim.messages)
    app.router.add_post("/v1/responses/input_tokens", sim.count)
    app.router.add_post("/v1/messages/count_tokens", sim.count)
    app.router.add_get("/v1/responses/{id}", sim.stored)
    app.router.add_delete("/v1/responses/{id}", sim.stored)
    app.router.add_post("/v1/responses/{id}/cancel", sim.stored)
    app.router.add_get("/v1/responses/{id}/input_items", sim.stored)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/health", sim.health)
    app.router.add_get("/docs", sim.health)
    app.router.add_get("/sim/stats", sim.get_stats)
    app.router.add_post("/sim/reset", sim.reset_stats)
    app.router.add_get("/sim/config", sim.get_config)
    app.router.add_post("/sim/config", sim.set_config)
    return app


def sim_runner(app: web.Application) -> web.AppRunner:
    """A runner that cancels handlers whose client left, so the stats see it at once."""
    return web.AppRunner(
        app, handle_signals=False, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
    )


async def serve_sim(options: SimOptions, host: str, port: int) -> None:
    """Serve one simulated region until SIGTERM/SIGINT."""
    from router.server.run import run_until_signal

    def ready(url: str) -> None:
        print(f"sim region {options.name} listening on {url}", flush=True)

    await run_until_signal(sim_runner(build_sim_app(options)), f"{host}:{port}", ready)
