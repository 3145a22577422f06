"""What the real servers do at the edges the router must handle (see tests/real/survey.py).

These pin today's behaviour of the pinned versions, so a version bump that changes it fails here
first rather than in the router's own tests.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import pytest

from tests.real.conftest import RealFactory
from tests.real.servers import MODEL_ALIAS
from tests.support import Proc

pytestmark = pytest.mark.real

OVERFLOW = [{"role": "user", "content": "The router sends each request onwards. " * 300}]


def post(
    proc: Proc, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=60)
    conn.request(
        "POST",
        path,
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload


def get(proc: Proc, path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=120)
    conn.request("GET", path)
    conn.getresponse().read()
    conn.close()


def chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    return {
        "model": MODEL_ALIAS,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


@pytest.mark.parametrize(
    ("request_id", "status"),
    [
        ("0123456789abcdef01234567", 400),  # 24 hex: not a UUID
        ("req-123", 400),
        ("0123456789abcdef0123456789abcdef", 200),
        ("01234567-89ab-cdef-0123-456789abcdef", 200),
    ],
)
def test_llama_cpp_python_accepts_only_uuid_request_ids(
    llama_cpp_server: Proc, request_id: str, status: int
) -> None:
    got, headers, payload = post(
        llama_cpp_server, "/v1/chat/completions", chat(1), {"X-Request-Id": request_id}
    )
    assert got == status
    if status == 400:
        assert payload == b""
        assert headers["content-length"] == "0"
    else:
        assert headers["x-request-id"] == request_id


def test_llama_server_ignores_request_id(llama_server: Proc) -> None:
    status, headers, _ = post(
        llama_server, "/v1/chat/completions", chat(1), {"X-Request-Id": "0123456789abcdef01234567"}
    )
    assert status == 200
    assert "x-request-id" not in headers


def test_llama_server_context_overflow_is_400_also_when_streamed(llama_server: Proc) -> None:
    for stream in (False, True):
        status, _, payload = post(
            llama_server,
            "/v1/chat/completions",
            {**chat(16), "messages": OVERFLOW, "stream": stream},
        )
        assert status == 400
        assert json.loads(payload)["error"]["type"] == "exceed_context_size_error"


def test_llama_server_without_a_vision_model_answers_an_image_with_a_500(
    llama_server: Proc,
) -> None:
    # A request error all the same: the router's core.attempt.server_refusal reads it so.
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {**chat(1), "messages": [{"role": "user", "content": [image]}]}
    for stream in (False, True):
        status, _, payload = post(llama_server, "/v1/chat/completions", {**body, "stream": stream})
        assert status == 500
        error = json.loads(payload)["error"]
        assert error["type"] == "server_error"
        assert error["message"].startswith("image input is not supported")


def test_llama_cpp_python_answers_a_body_it_cannot_take_with_a_500_quoting_its_check(
    llama_cpp_server: Proc,
) -> None:
    # A request error all the same: the router's core.attempt.server_refusal reads it so, and
    # the sim's llama-cpp-python kind answers the same way.
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    for body in (
        {**chat(1), "messages": [{"role": "wizard", "content": "x"}]},
        {**chat(1), "response_format": schema},
    ):
        status, _, payload = post(llama_cpp_server, "/v1/chat/completions", body)
        assert status == 500
        error = json.loads(payload)["error"]
        assert error["type"] == "internal_server_error"
        assert "validation error" in error["message"]
        assert "'loc': ('body'," in error["message"]


def test_llama_cpp_python_streamed_overflow_is_200_and_empty(llama_cpp_server: Proc) -> None:
    status, _, payload = post(
        llama_cpp_server, "/v1/chat/completions", {**chat(16), "messages": OVERFLOW}
    )
    assert status == 400
    assert json.loads(payload)["error"]["code"] == "context_length_exceeded"
    status, headers, payload = post(
        llama_cpp_server, "/v1/chat/completions", {**chat(16), "messages": OVERFLOW, "stream": True}
    )
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert payload == b""


def test_prefill_llama_server_continues_llama_cpp_python_starts_a_new_turn(
    llama_server: Proc, llama_cpp_server: Proc
) -> None:
    head = "<|im_start|>user\nWrite a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a time"
    messages = [
        {"role": "user", "content": "Write a story."},
        {"role": "assistant", "content": "Once upon a time"},
    ]
    _, _, payload = post(llama_server, "/apply-template", {"messages": messages})
    assert json.loads(payload)["prompt"] == head
    body = {"model": MODEL_ALIAS, "messages": messages, "max_tokens": 2, "temperature": 0}
    _, _, payload = post(llama_server, "/v1/chat/completions", body)
    # the answer repeats the prefilled text, then continues it
    assert json.loads(payload)["choices"][0]["message"]["content"].startswith("Once upon a time")
    _, _, payload = post(llama_cpp_server, "/v1/chat/completions", body)
    done = json.loads(payload)
    assert not done["choices"][0]["message"]["content"].startswith("Once upon a time")
    # 34 tokens: head + "<|im_end|>\n<|im_start|>assistant\n", the message closed, a new turn
    assert done["usage"]["prompt_tokens"] == 34


def test_llama_server_streams_its_prefill_echo_with_the_first_new_token(
    llama_server: Proc,
) -> None:
    """The answer-back of a prefill is not an event of its own: it comes with the first new
    token (the router counts the tokens a client had by their events; the sim does the same)."""
    messages = [
        {"role": "user", "content": "Tell me about the sea."},
        {"role": "assistant", "content": "The sea is a big"},
    ]
    for path, body in (
        ("/v1/chat/completions", {"messages": messages}),
        ("/v1/messages", {"messages": messages}),
    ):
        asked = {"model": MODEL_ALIAS, "stream": True, "max_tokens": 3, "temperature": 0, **body}
        _, _, payload = post(llama_server, path, asked)
        texts = []
        for line in payload.decode().splitlines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if "choices" in event:
                piece = event["choices"][0]["delta"].get("content")
            else:
                piece = (event.get("delta") or {}).get("text")
            if piece:
                texts.append(piece)
        assert len(texts) == 3, texts  # one event per token, the echo included in the first
        assert texts[0].startswith("The sea is a big")
        assert len(texts[0]) > len("The sea is a big")


def _pieces(proc: Proc, body: dict[str, Any]) -> list[str]:
    _, _, payload = post(proc, "/v1/chat/completions", {"model": MODEL_ALIAS, **body})
    return [
        choice["delta"]["content"]
        for line in payload.decode().splitlines()
        if line.startswith("data: {")
        for choice in json.loads(line[6:])["choices"]
        if choice["delta"].get("content")
    ]


def test_llama_server_holds_back_text_that_may_begin_a_stop_string(llama_server: Proc) -> None:
    """What it streams never ends with the start of a stop string (it holds such text back until
    it knows): a stream cut at any point leaves the client no stop string begun, so one never
    spans the seam of a continuation after llama-server (the router checks for it anyway)."""
    asked: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "stream": True,
        "max_tokens": 20,
        "temperature": 0,
    }
    plain = _pieces(llama_server, asked)
    # A stop string across two tokens: the end of the 4th, the start of the 5th.
    stop = "".join(plain[:4])[-2:] + plain[4][:3]
    pieces = _pieces(llama_server, {**asked, "stop": [stop]})
    whole = "".join(plain)
    assert "".join(pieces) == whole[: whole.index(stop)]
    sent = ""
    for piece in pieces:
        sent += piece
        assert not any(sent.endswith(stop[:cut]) for cut in range(1, len(stop))), (sent, stop)


def test_llama_server_gives_no_logprobs_for_its_prefill_echo(llama_server: Proc) -> None:
    """The event carrying the answer-back of a prefill has logprobs for its new token only:
    the router drops the echoed text and keeps the event's logprobs as they are."""
    messages = [
        {"role": "user", "content": "Tell me about the sea."},
        {"role": "assistant", "content": "The sea is a big"},
    ]
    asked = {
        "model": MODEL_ALIAS,
        "messages": messages,
        "stream": True,
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    _, _, payload = post(llama_server, "/v1/chat/completions", asked)
    spelled = []
    for line in payload.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                if choice["delta"].get("content"):
                    tokens = (choice.get("logprobs") or {}).get("content") or []
                    spelled.append(
                        (choice["delta"]["content"], "".join(t["token"] for t in tokens))
                    )
    echoed, new = spelled[0]
    assert echoed.startswith("The sea is a big")
    assert echoed == "The sea is a big" + new  # one logprob, the new token's
    assert all(piece == tokens for piece, tokens in spelled[1:])


@pytest.mark.timeout(300)
def test_llama_cpp_python_interrupted_stream_ends_with_done_and_no_finish_reason(
    start_real: RealFactory,
) -> None:
    proc = start_real("llama-cpp-python")
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=120)
    body = json.dumps(chat(400, stream=True)).encode()
    conn.request(
        "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    assert resp.status == 200
    lines: list[bytes] = []
    while len([ln for ln in lines if ln.startswith(b"data: {")]) < 3:
        lines.append(resp.readline())
    # any request waiting for the model lock interrupts the stream, even GET /v1/models
    models = threading.Thread(target=get, args=(proc, "/v1/models"))
    models.start()
    lines += resp.readlines()
    models.join(120)
    conn.close()
    data = [ln for ln in lines if ln.startswith(b"data:")]
    assert data[-1] == b"data: [DONE]\n"
    chunks = [json.loads(ln[5:]) for ln in data[:-1]]
    assert len(chunks) < 400
    assert {c["choices"][0]["finish_reason"] for c in chunks} == {None}
