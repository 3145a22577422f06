"""A deliberately misbehaving OpenAI-compatible provider whose fault is chosen per request.

`python -m tests.faults.provider --port P` serves POST /v1/chat/completions on 127.0.0.1 (stream
and not) with the deterministic text of `router sim-region` (router.sim.text), so a stream the
router continues on a sim region reads as one answer. The request's headers pick the fault:

    x-fault          none | 429 | 500 | 503 | reset | blackhole | slow-first-token | cut | drop |
                     done-early | stall | bad-event | deep-event | no-done | context-length |
                     context-length-llama | context-length-vllm | content-policy |
                     down  (cut: a clean HTTP end after K tokens, no finish, no [DONE]; drop: the
                     connection closed after K tokens, no terminating chunk; done-early: [DONE]
                     after K tokens, no finish)
    x-fault-key      the request's key (default ""): attempts are counted per key
    x-fault-times    the fault hits the first N attempts of the key, then it answers (default: all)
    x-fault-retry-after   429: the Retry-After value (unset: none sent)
    x-fault-after    streams: content tokens sent before the cut, stall or invalid event (default 3)
    x-fault-delay    slow-first-token: seconds before the first token; stall: seconds of silence
    x-fault-for      down: 503 for this many seconds after the start or the last POST /arm
    x-fault-on-prefill    reject: a request ending in an assistant message (a continuation) gets
                     a 400 invalid_request_error instead, whatever x-fault says

GET /health answers 200 (the prober keeps it in rotation: the fault is on the inference path).
GET /stats answers {"started", "armed", "attempts": [{"key", "fault", "hit", "t", "stream",
"model", "prefill"}]} with `t` from time.monotonic() (system-wide on Linux, so a test can compare
it with its own clock); GET /stats?key=K keeps only that key's attempts. POST /arm restarts the
`down` clock. The process stops itself after --lifetime seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from router.sim.text import chat_tokens, count_prompt_tokens

FAULTS = (
    "none",
    "429",
    "500",
    "503",
    "reset",
    "blackhole",
    "slow-first-token",
    "cut",
    "drop",
    "done-early",
    "stall",
    "bad-event",
    "deep-event",
    "no-done",
    "context-length",
    "context-length-llama",
    "context-length-vllm",
    "content-policy",
    "down",
)
_MAX_HEAD = 64 * 1024
_LIFETIME_S = 300.0


@dataclass
class Request:
    """One parsed request: method, path, lower-cased headers, body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class State:
    """What the provider saw, and the `down` fault's clock."""

    started: float = field(default_factory=time.monotonic)
    armed: float = field(default_factory=time.monotonic)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)


async def _read(reader: asyncio.StreamReader) -> Request | None:
    """The next request on the connection; None when the client went away."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) < 2:
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return Request(parts[0], parts[1], headers, body)


def _response(status: str, payload: Any, extra: str = "") -> bytes:
    data = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode() + data


def _error(message: str, kind: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(payload: Any) -> bytes:
    return _chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")


@dataclass
class Answer:
    """The deterministic answer to one chat request."""

    model: str
    tokens: list[str]
    prompt_tokens: int
    ident: str = "chatcmpl-provider"

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": self.ident,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": self.model,
            "choices": [choice],
        }

    def usage(self) -> dict[str, int]:
        done = len(self.tokens)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
        }

    def whole(self) -> dict[str, Any]:
        message = {"role": "assistant", "content": "".join(self.tokens)}
        return {
            "id": self.ident,
            "object": "chat.completion",
            "created": 1,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": self.usage(),
        }


def _answer_for(body: dict[str, Any]) -> Answer:
    model = str(body.get("model", ""))
    messages = body.get("messages") or []
    tokens, _ = chat_tokens(model, messages)
    return Answer(model, tokens, count_prompt_tokens(messages))


async def _stream(
    writer: asyncio.StreamWriter, answer: Answer, fault: str, req: Request, usage: bool
) -> None:
    after = int(req.headers.get("x-fault-after", "3"))
    delay = float(req.headers.get("x-fault-delay", "0"))
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    writer.write(_event(answer.chunk({"role": "assistant", "content": ""})))
    await writer.drain()
    if fault == "slow-first-token":
        await asyncio.sleep(delay)
    for i, token in enumerate(answer.tokens):
        if i == after and fault == "cut":
            writer.write(b"0\r\n\r\n")  # a clean end at the HTTP level: no finish, no [DONE]
            await writer.drain()
            return
        if i == after and fault == "drop":
            writer.transport.close()  # no terminating chunk: the body ends short
            return
        if i == after and fault == "done-early":
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            return
        if i == after and fault == "stall":
            await asyncio.sleep(delay)
        if i == after and fault == "bad-event":
            writer.write(_chunk(b'data: {"id": "chatcmpl-provider", "choices": [{"delta": \n\n'))
        if i == after and fault == "deep-event":
            # Valid JSON, nested past what JSON decoders in Python reach (theirs and the SDK's:
            # about 1,000 levels on 3.11, 10,000 from 3.12 on).
            deep = b"[" * 100_000 + b"]" * 100_000
            writer.write(_chunk(b'data: {"id": "chatcmpl-provider", "x": ' + deep + b"}\n\n"))
        writer.write(_event(answer.chunk({"content": token})))
        await writer.drain()
    writer.write(_event(answer.chunk({}, "stop")))
    if usage:
        writer.write(_event({**answer.chunk({}), "choices": [], "usage": answer.usage()}))
    if fault != "no-done":
        writer.write(_chunk(b"data: [DONE]\n\n"))
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0): the client reads no byte, only a reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _chat(state: State, req: Request, writer: asyncio.StreamWriter) -> None:
    headers = req.headers
    fault = headers.get("x-fault", "none")
    key = headers.get("x-fault-key", "")
    nth = state.seen.get(key, 0)
    state.seen[key] = nth + 1
    times = headers.get("x-fault-times")
    hit = fault != "none" and (times is None or nth < int(times))
    if fault == "down":
        hit = time.monotonic() - state.armed < float(headers.get("x-fault-for", "0"))
    body: dict[str, Any] = json.loads(req.body or b"{}")
    messages = body.get("messages") or []
    prefill = bool(messages) and isinstance(messages[-1], dict)
    prefill = prefill and messages[-1].get("role") == "assistant"
    state.attempts.append(
        {
            "key": key,
            "fault": fault,
            "hit": hit,
            "t": time.monotonic(),
            "stream": bool(body.get("stream")),
            "model": body.get("model"),
            "prefill": prefill,
        }
    )
    fault = fault if hit else "none"
    if prefill and headers.get("x-fault-on-prefill") == "reject":
        refused = _error(
            "Assistant prefill is not supported by this provider.", "invalid_request_error", None
        )
        writer.write(_response("400 Bad Request", refused))
    elif fault == "429":
        after = headers.get("x-fault-retry-after")
        extra = f"Retry-After: {after}\r\n" if after is not None else ""
        limited = _error("Rate limit reached for requests", "rate_limit_error", "rate_limit")
        writer.write(_response("429 Too Many Requests", limited, extra))
    elif fault == "500":
        oops = _error("The server had an error processing your request.", "server_error", None)
        writer.write(_response("500 Internal Server Error", oops))
    elif fault in ("503", "down"):
        busy = _error("The provider is overloaded (provider 503).", "server_error", "overloaded")
        writer.write(_response("503 Service Unavailable", busy))
    elif fault == "reset":
        _reset(writer)
        return
    elif fault == "blackhole":
        await asyncio.sleep(_LIFETIME_S)
    elif fault == "context-length":
        long = _error(
            "This model's maximum context length is 8 tokens (provider).",
            "invalid_request_error",
            "context_length_exceeded",
        )
        writer.write(_response("400 Bad Request", long))
    elif fault == "context-length-llama":
        # llama-server's words for it (tests/real/test_server_quirks.py pins the type).
        long = {
            "error": {
                "code": 400,
                "message": "request (1416 tokens) exceeds the available context size (1024 "
                "tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 1416,
                "n_ctx": 1024,
            }
        }
        writer.write(_response("400 Bad Request", long))
    elif fault == "context-length-vllm":
        # vLLM's: an error object at the top, its type the exception's name, the status as code.
        long = {
            "object": "error",
            "message": "This model's maximum context length is 1024 tokens. However, you "
            "requested 1416 tokens in the messages. Please reduce the length of the messages.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
        writer.write(_response("400 Bad Request", long))
    elif fault == "content-policy":
        refused = _error(
            "Your request was rejected by the provider's content policy.",
            "invalid_request_error",
            "content_policy_violation",
        )
        writer.write(_response("400 Bad Request", refused))
    else:
        answer = _answer_for(body)
        if body.get("stream"):
            options = body.get("stream_options") or {}
            await _stream(writer, answer, fault, req, bool(options.get("include_usage")))
            return
        writer.write(_response("200 OK", answer.whole()))
    await writer.drain()


async def _serve_one(
    state: State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        req = await _read(reader)
        if req is None:
            return
        url = urlsplit(req.path)
        if url.path.endswith("/health"):
            writer.write(_response("200 OK", {"status": "ok"}))
        elif url.path.endswith("/models"):
            listed = {"object": "list", "data": [{"id": "sim-1", "object": "model"}]}
            writer.write(_response("200 OK", listed))
        elif url.path == "/stats":
            wanted = parse_qs(url.query).get("key")
            attempts = [a for a in state.attempts if wanted is None or a["key"] in wanted]
            stats = {"started": state.started, "armed": state.armed, "attempts": attempts}
            writer.write(_response("200 OK", stats))
        elif url.path == "/arm" and req.method == "POST":
            state.armed = time.monotonic()
            writer.write(_response("200 OK", {"armed": state.armed}))
        elif url.path.endswith("/chat/completions") and req.method == "POST":
            await _chat(state, req, writer)
            return
        else:
            writer.write(_response("404 Not Found", _error("no such route", "not_found", None)))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        if not writer.transport.is_closing():
            writer.close()


async def _main(port: int, lifetime: float) -> None:
    state = State()
    server = await asyncio.start_server(
        lambda r, w: _serve_one(state, r, w), "127.0.0.1", port, limit=_MAX_HEAD
    )
    async with server:
        await asyncio.sleep(lifetime)


def main() -> None:
    """Parse flags and serve until the lifetime ends or the process is killed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lifetime", type=float, default=_LIFETIME_S)
    args = parser.parse_args()
    asyncio.run(_main(args.port, min(args.lifetime, _LIFETIME_S)))


if __name__ == "__main__":
    main()
