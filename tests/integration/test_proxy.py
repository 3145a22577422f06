"""The router in front of simulated regions, driven by the real `openai` SDK and raw HTTP."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from router.core.upstream import upstream_id
from router.sim import text
from tests.integration.conftest import (
    MODEL,
    region_toml,
    sim_reset,
    sim_stats,
    start_router,
    start_sim,
)
from tests.support import Proc, free_port, wait_for_port

HEADER = """
[server]
max_body_bytes = 4096
# The backpressure test streams 1 MiB tokens.
max_event_bytes = 4194304
header_timeout_s = 1.0
body_timeout_s = 1.0
drain_timeout_s = 10.0

[timeouts]
connect = 1.0
first_byte = 5.0
idle = 5.0
total = 30.0

[models]
aliases = { "gpt-alias" = "sim-1" }

[auth]
enabled = false
"""
MESSAGES = [{"role": "user", "content": "Tell me about regions."}]


class Env:
    """Two sim regions (a preferred, b second) and one router, shared by a module's tests."""

    def __init__(self, a: Proc, b: Proc, router: Proc) -> None:
        self.a = a
        self.b = b
        self.router = router
        self.client = openai.OpenAI(
            base_url=router.url + "/v1", api_key="client-key", max_retries=0
        )
        self.direct = openai.OpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("proxy")
    a = start_sim(tmp, "a")
    b = start_sim(tmp, "b")
    config = HEADER + region_toml(a, api_key_env="SIM_A_KEY") + region_toml(b, bias_ms=50.0)
    router = start_router(tmp, config, env={"SIM_A_KEY": "region-a-secret"})
    e = Env(a, b, router)
    yield e
    e.client.close()
    e.direct.close()
    for proc in (router, a, b):
        proc.kill()


@pytest.fixture(autouse=True)
def _fresh_stats(request: pytest.FixtureRequest) -> None:
    if "env" in request.fixturenames:
        e: Env = request.getfixturevalue("env")
        sim_reset(e.a)
        sim_reset(e.b)


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `check` until true or `timeout` passes (bounded, for cross-process effects)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


# ---- the OpenAI SDK as the client ----


def test_chat_non_stream_via_sdk(env: Env) -> None:
    out = env.client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == text.full_chat_text(MODEL, MESSAGES)
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None
    assert out.usage.completion_tokens > 0
    assert sim_stats(env.a)["completed"] == 1
    assert sim_stats(env.b)["requests"] == 0


def test_chat_stream_via_sdk_matches_non_stream(env: Env) -> None:
    stream = env.client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == text.full_chat_text(MODEL, MESSAGES)
    assert usage is not None
    assert usage.completion_tokens == len(pieces)


def test_stream_has_no_usage_unless_asked(env: Env) -> None:
    stream = env.client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
    )
    chunks = list(stream)
    assert chunks
    assert all(c.usage is None for c in chunks)
    # The router injected nothing: the region saw no stream_options.
    assert "stream_options" not in sim_stats(env.a)["last_body"]


def test_alias_is_rewritten_for_the_region(env: Env) -> None:
    out = env.client.chat.completions.create(model="gpt-alias", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.choices[0].message.content == text.full_chat_text(MODEL, MESSAGES)
    assert json.loads(sim_stats(env.a)["last_body"])["model"] == MODEL


def test_completions_stream_and_not(env: Env) -> None:
    whole = env.client.completions.create(model=MODEL, prompt="Once upon a time")
    streamed = "".join(
        c.choices[0].text
        for c in env.client.completions.create(model=MODEL, prompt="Once upon a time", stream=True)
        if c.choices
    )
    assert whole.choices[0].text == streamed
    assert whole.choices[0].text == "".join(text.completion_tokens(MODEL, "Once upon a time"))


def test_embeddings_via_sdk(env: Env) -> None:
    out = env.client.embeddings.create(model=MODEL, input=["alpha", "beta"])
    assert [d.index for d in out.data] == [0, 1]
    expected = text.embedding(MODEL, "alpha", 16)
    assert out.data[0].embedding == pytest.approx(expected, rel=1e-6)
    assert out.data[0].embedding != out.data[1].embedding


def test_models_lists_aliases_and_region_models(env: Env) -> None:
    ids = sorted(m.id for m in env.client.models.list())
    assert ids == ["gpt-alias", MODEL]


def test_prefill_continues_the_same_sequence(env: Env) -> None:
    full = text.full_chat_text(MODEL, MESSAGES)
    prefix = full[:17]
    out = env.client.chat.completions.create(
        model=MODEL,
        messages=[*MESSAGES, {"role": "assistant", "content": prefix}],  # type: ignore[list-item]
        # vLLM (the sim's kind here) continues the last message only when asked to.
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert prefix + (out.choices[0].message.content or "") == full


# ---- raw HTTP: byte-exactness, headers, pass-through ----


def test_non_stream_body_is_byte_exact(env: Env) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "unknown_field": {"kept": [1, 2.5, None]}}
    raw = json.dumps(body, separators=(",", ":"))
    via_router = httpx.post(
        env.router.url + "/v1/chat/completions",
        content=raw,
        headers={"Content-Type": "application/json"},
    )
    direct = httpx.post(
        env.a.url + "/v1/chat/completions",
        content=raw,
        headers={"Content-Type": "application/json"},
    )
    assert via_router.status_code == 200
    assert via_router.content == direct.content
    # Unknown request fields reach the region untouched (the body is forwarded as sent).
    assert sim_stats(env.a)["last_body"] == raw


def test_stream_bytes_match_direct(env: Env) -> None:
    raw = json.dumps({"model": MODEL, "messages": MESSAGES, "stream": True})
    headers = {"Content-Type": "application/json"}
    via_router = httpx.post(env.router.url + "/v1/chat/completions", content=raw, headers=headers)
    direct = httpx.post(env.a.url + "/v1/chat/completions", content=raw, headers=headers)
    assert via_router.headers["content-type"].startswith("text/event-stream")
    assert via_router.content == direct.content
    assert via_router.content.endswith(b"data: [DONE]\n\n")


def test_region_key_replaces_client_key_and_request_id_flows(env: Env) -> None:
    resp = httpx.post(
        env.router.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={"Authorization": "Bearer client-key", "X-Request-Id": "req-123"},
    )
    assert resp.status_code == 200
    assert resp.headers["x-request-id"] == "req-123"
    seen = {k.lower(): v for k, v in sim_stats(env.a)["last_headers"].items()}
    assert seen["authorization"] == "Bearer region-a-secret"
    # Regions get a UUID (llama-cpp-python refuses anything else), derived from the client's.
    assert seen["x-request-id"] == upstream_id("req-123")
    assert uuid.UUID(seen["x-request-id"])


def test_generated_request_id_when_client_sends_a_bad_one(env: Env) -> None:
    resp = httpx.post(
        env.router.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={"X-Request-Id": "bad id with spaces"},
    )
    rid = resp.headers["x-request-id"]
    assert rid != "bad id with spaces"
    assert uuid.UUID(rid).version == 4


# ---- attempt loop ----


def test_retries_next_region_on_503_before_first_byte(env: Env) -> None:
    out = env.client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        extra_headers={"x-sim-fail": "503", "x-sim-only": "a"},
    )
    assert out.choices[0].message.content == text.full_chat_text(MODEL, MESSAGES)
    assert sim_stats(env.a)["injected_failures"] == 1
    assert sim_stats(env.b)["completed"] == 1


@pytest.mark.parametrize("fail", ["500", "429", "refuse"])
def test_retries_stream_on_failures_before_first_byte(env: Env, fail: str) -> None:
    stream = env.client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"x-sim-fail": fail, "x-sim-only": "a"},
    )
    got = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert got == text.full_chat_text(MODEL, MESSAGES)
    assert sim_stats(env.b)["streams"] == 1


def test_all_regions_failing_relays_the_last_answer(env: Env) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        env.client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_headers={"x-sim-fail": "429"},
        )
    assert info.value.response.headers["retry-after"] == "1"
    assert sim_stats(env.a)["injected_failures"] == 1
    assert sim_stats(env.b)["injected_failures"] == 1


def test_non_retryable_upstream_error_passes_through(env: Env) -> None:
    resp = httpx.post(
        env.router.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={"x-sim-fail": "bogus-mode"},
    )
    assert resp.status_code == 400
    assert sim_stats(env.b)["requests"] == 0


def test_mid_stream_death_ends_with_an_error_event(env: Env) -> None:
    stream = env.client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"x-sim-fail": "die-mid-stream", "x-sim-after-tokens": "2"},
    )
    pieces: list[str] = []

    def consume() -> None:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)

    with pytest.raises(openai.APIError, match="mid-stream"):
        consume()
    assert len(pieces) == 2


# ---- client disconnect ----


def test_client_disconnect_cancels_upstream_at_once(env: Env) -> None:
    headers = {"Content-Type": "application/json", "x-sim-tokens-per-s": "5"}
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "stream": True})
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "POST", env.router.url + "/v1/chat/completions", content=body, headers=headers
        ) as resp,
    ):
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(3)]
        assert got[0].startswith("data: ")
        assert sim_stats(env.a)["active"] == 1
    # The full answer would take several seconds at 5 tokens/s; the region must stop early.
    assert wait_until(lambda: sim_stats(env.a)["cancelled"] == 1, timeout=3.0)
    stats = sim_stats(env.a)
    assert stats["active"] == 0
    assert stats["completed"] == 0
    assert stats["tokens_sent"] < len(text.full_chat_text(MODEL, MESSAGES).split())
    # A client leaving is routine, not a router error.
    assert "Traceback" not in env.router.output()


# ---- bad input: OpenAI-shaped errors, and the server keeps serving ----


def _post(
    env: Env,
    content: bytes,
    content_type: str | None = "application/json",
    path: str = "/v1/chat/completions",
) -> httpx.Response:
    headers = {"Content-Type": content_type} if content_type else {}
    return httpx.post(env.router.url + path, content=content, headers=headers)


BAD: list[tuple[str, bytes, str | None, int, str | None]] = [
    ("malformed json", b'{"model": "sim-1", "messages": [', "application/json", 400, None),
    ("not an object", b"[1, 2]", "application/json", 400, None),
    ("empty body", b"", "application/json", 400, None),
    (
        "missing model",
        b'{"messages": [{"role": "user", "content": "x"}]}',
        "application/json",
        400,
        "model",
    ),
    ("missing messages", b'{"model": "sim-1"}', "application/json", 400, "messages"),
    (
        "messages wrong type",
        b'{"model": "sim-1", "messages": "hi"}',
        "application/json",
        400,
        "messages",
    ),
    (
        "role wrong type",
        b'{"model": "sim-1", "messages": [{"role": 5}]}',
        "application/json",
        400,
        "messages[0].role",
    ),
    (
        "stream wrong type",
        b'{"model": "sim-1", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
        "application/json",
        400,
        "stream",
    ),
    ("empty messages", b'{"model": "sim-1", "messages": []}', "application/json", 400, "messages"),
    (
        "invalid utf-8",
        b'{"model": "sim-1", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        "application/json",
        400,
        None,
    ),
    (
        "unknown model",
        b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}',
        "application/json",
        404,
        "model",
    ),
    ("form content type", b"model=sim-1", "application/x-www-form-urlencoded", 415, None),
    (
        "too large",
        b'{"model": "sim-1", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}',
        "application/json",
        413,
        None,
    ),
]


@pytest.mark.parametrize(
    ("content", "ctype", "status", "param"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input_gets_openai_shaped_error(
    env: Env, content: bytes, ctype: str | None, status: int, param: str | None
) -> None:
    resp = _post(env, content, ctype)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param
    assert sim_stats(env.a)["requests"] == 0
    # Everyone else is still served.
    assert (
        _post(env, json.dumps({"model": MODEL, "messages": MESSAGES}).encode()).status_code == 200
    )


def test_completions_prompt_of_wrong_type_is_400(env: Env) -> None:
    resp = _post(env, b'{"model": "sim-1", "prompt": [1, "a"]}', path="/v1/completions")
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "prompt"


def test_unknown_path_and_method_are_openai_shaped(env: Env) -> None:
    missing = httpx.get(env.router.url + "/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = httpx.get(env.router.url + "/v1/chat/completions")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["type"] == "invalid_request_error"


def test_health_endpoints(env: Env) -> None:
    assert httpx.get(env.router.url + "/healthz").status_code == 200
    assert httpx.get(env.router.url + "/readyz").json() == {"status": "ready"}


def test_slow_loris_headers_are_cut_off(env: Env) -> None:
    with socket.create_connection(("127.0.0.1", env.router.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        began = time.monotonic()
        # header_timeout_s = 1: the router closes the connection (recv returns b"").
        assert sock.recv(4096) == b""
        assert time.monotonic() - began < 8
    assert httpx.get(env.router.url + "/healthz").status_code == 200


def test_slow_body_gets_408(env: Env) -> None:
    with socket.create_connection(("127.0.0.1", env.router.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model"'
        )
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 408")
    assert b'"request_timeout"' in head or b"request_timeout" in head


# ---- graceful shutdown ----


def test_sigterm_drains_in_flight_stream(tmp_path: Path) -> None:
    a = start_sim(tmp_path, "a")
    router = start_router(tmp_path, HEADER + region_toml(a))
    try:
        headers = {"Content-Type": "application/json", "x-sim-tokens-per-s": "40"}
        body = json.dumps({"model": MODEL, "messages": MESSAGES, "stream": True})
        with (
            httpx.Client(timeout=15) as client,
            client.stream(
                "POST", router.url + "/v1/chat/completions", content=body, headers=headers
            ) as resp,
        ):
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            router.popen.send_signal(signal.SIGTERM)
            # Stop accepting: new connections are refused soon after the signal.
            assert wait_until(lambda: not _accepts(router.port), timeout=5.0)
            rest = list(lines)
        assert "data: [DONE]" in rest
        assert router.popen.wait(timeout=15) == 0
        stats: dict[str, Any] = sim_stats(a)
        assert stats["completed"] == 1
        assert stats["cancelled"] == 0
    finally:
        router.kill()
        a.kill()


def test_a_drain_ends_what_outlasts_it_cleanly(tmp_path: Path) -> None:
    # A stream far longer than drain_timeout_s and a whole answer the region has not started:
    # at the drain's deadline the stream gets one error event and a clean end, the other a
    # 503 to retry, both logged as what they were; the router exits soon after the deadline.
    a = start_sim(tmp_path, "a")
    text = HEADER.replace("drain_timeout_s = 10.0", "drain_timeout_s = 4.0")
    # Idle connections are kept long enough that only the drain can close one here.
    text = text.replace("header_timeout_s = 1.0", "header_timeout_s = 30.0")
    router = start_router(
        tmp_path, text.replace("first_byte = 5.0", "first_byte = 20.0") + region_toml(a)
    )
    stack = contextlib.ExitStack()
    try:
        url = router.url + "/v1/chat/completions"
        slow = {"Content-Type": "application/json", "x-sim-tokens-per-s": "5"}
        body = json.dumps({"model": MODEL, "messages": MESSAGES, "stream": True, "max_tokens": 500})
        late = {"Content-Type": "application/json", "x-sim-ttft-ms": "15000"}
        whole = json.dumps({"model": MODEL, "messages": MESSAGES})
        # A client with a kept-alive connection, idle when the drain begins.
        idle = socket.create_connection(("127.0.0.1", router.port), timeout=10)
        stack.callback(idle.close)  # also when the test fails (never left to the collector)
        healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        idle.sendall(healthz)
        assert idle.recv(65536).startswith(b"HTTP/1.1 200")
        with httpx.Client(timeout=15) as client:
            waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
                client.post, url, content=whole, headers=late
            )
            with client.stream("POST", url, content=body, headers=slow) as resp:
                lines = resp.iter_lines()
                assert next(lines).startswith("data: ")
                # Read before the signal: the drain's 4 s start after it, never before.
                began = time.monotonic()
                router.popen.send_signal(signal.SIGTERM)

                def idle_asks() -> tuple[bytes, float]:
                    assert wait_until(lambda: not _accepts(router.port), timeout=5.0)
                    try:
                        idle.sendall(healthz)
                        got = idle.recv(65536)
                    except ConnectionResetError:
                        # Closed before the request arrived: the kernel answered it with a
                        # reset, which can overtake the end already sent.
                        got = b""
                    return got, time.monotonic()

                asked = concurrent.futures.ThreadPoolExecutor(1).submit(idle_asks)
                rest = [line for line in lines if line]  # ends cleanly: no read error
                stream_ended = time.monotonic()
            ended_s = stream_ended - began
            # The idle connection is closed at once (its client goes elsewhere), not left to
            # swallow a request until the drain ends: its EOF came while the stream still ran.
            got, closed_at = asked.result(timeout=15)
            assert got == b""
            assert closed_at < stream_ended  # before the drain's end, which closes all
            answer = waiting.result(timeout=15)
        assert "data: [DONE]" not in rest
        assert "shutting down" in rest[-1], rest[-3:]
        assert json.loads(rest[-1].removeprefix("data: "))["error"]["code"] == "shutting_down"
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "shutting_down"
        assert router.popen.wait(timeout=15) == 0
        # Not cut at once (the drain waited its 4 s), nor left to its natural 100 s.
        assert 4.0 <= ended_s < 30, ended_s
        lines = router.access_lines(2)
        assert sorted(line["status"] for line in lines) == [200, 503]
        (stream,) = [line for line in lines if line["status"] == 200]
        assert "shutting down" in stream["error"]
        # Ended by the router's own shutdown: neither is held against the region.
        assert all(line["drained"] for line in lines)
        assert "Traceback" not in router.output()
    finally:
        stack.close()
        router.kill()
        a.kill()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# ---- upstream timeouts and dead regions (a router with short deadlines) ----

FAST_TIMEOUTS = HEADER.replace("first_byte = 5.0", "first_byte = 0.5").replace(
    "idle = 5.0", "idle = 0.5"
)


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Region a, region b and a router whose first-byte and idle deadlines are 0.5 s."""
    tmp = tmp_path_factory.mktemp("short")
    a = start_sim(tmp, "a")
    b = start_sim(tmp, "b")
    router = start_router(tmp, FAST_TIMEOUTS + region_toml(a) + region_toml(b, bias_ms=50.0))
    e = Env(a, b, router)
    yield e
    e.client.close()
    e.direct.close()
    for proc in (router, a, b):
        proc.kill()


def test_hang_before_first_byte_times_out_to_next_region(short: Env) -> None:
    sim_reset(short.a)
    sim_reset(short.b)
    out = short.client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        extra_headers={"x-sim-fail": "hang", "x-sim-only": "a"},
    )
    assert out.choices[0].message.content == text.full_chat_text(MODEL, MESSAGES)
    assert sim_stats(short.b)["completed"] == 1
    # The router gave up on a and closed the connection, which cancels a's handler.
    assert wait_until(lambda: sim_stats(short.a)["cancelled"] == 1, timeout=3.0)


def test_every_region_hanging_is_504(short: Env) -> None:
    resp = httpx.post(
        short.router.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={"x-sim-fail": "hang"},
        timeout=10,
    )
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == "upstream_timeout"


def test_idle_stream_is_cut_with_an_error_event(short: Env) -> None:
    resp = httpx.post(
        short.router.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "stream": True},
        headers={"x-sim-fail": "hang", "x-sim-after-tokens": "2"},
        timeout=10,
    )
    events = [line for line in resp.text.split("\n\n") if line]
    # role chunk + 2 tokens from the region, then the router's error event; no [DONE].
    assert len(events) == 4
    assert "idle timeout" in json.loads(events[-1].removeprefix("data: "))["error"]["message"]
    assert "data: [DONE]" not in resp.text


def test_client_giving_up_on_non_stream_cancels_upstream(short: Env) -> None:
    sim_reset(short.a)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            short.router.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES},
            headers={"x-sim-ttft-ms": "3000"},
            timeout=0.3,
        )
    assert wait_until(lambda: sim_stats(short.a)["cancelled"] == 1, timeout=2.0)
    assert sim_stats(short.a)["completed"] == 0


def test_dead_region_is_skipped(tmp_path: Path) -> None:
    b = start_sim(tmp_path, "b")
    dead = f"""
[[regions]]
name = "dead"
base_url = "http://127.0.0.1:{free_port()}/v1"
models = ["{MODEL}"]
"""
    router = start_router(tmp_path, HEADER + dead + region_toml(b, bias_ms=50.0))
    try:
        with openai.OpenAI(base_url=router.url + "/v1", api_key="k", max_retries=0) as client:
            out = client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        assert out.choices[0].message.content == text.full_chat_text(MODEL, MESSAGES)
        # Whether the attempt loop hit the refused connect or health checks skipped the region
        # first, region b answered.
        assert sim_stats(b)["completed"] == 1
    finally:
        router.kill()
        b.kill()


def test_admin_listen_serves_a_second_address(tmp_path: Path) -> None:
    a = start_sim(tmp_path, "a")
    admin = free_port()
    config = HEADER.replace("[server]", f'[server]\nadmin_listen = "127.0.0.1:{admin}"')
    router = start_router(tmp_path, config + region_toml(a))
    try:
        wait_for_port(admin, 10.0, router.popen)
        assert httpx.get(f"http://127.0.0.1:{admin}/healthz").status_code == 200
    finally:
        router.kill()
        a.kill()


def test_stream_backpressure_reaches_the_region(env: Env) -> None:
    """A client that stops reading stalls the region instead of filling router memory."""
    pad = 1 << 20  # about 36 MB in all: more than every socket buffer on the path
    total = len(text.chat_tokens(MODEL, MESSAGES)[0])
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "stream": True})
    headers = {"Content-Type": "application/json", "x-sim-pad-bytes": str(pad)}
    with (
        httpx.Client(timeout=20) as client,
        client.stream(
            "POST", env.router.url + "/v1/chat/completions", content=body, headers=headers
        ) as resp,
    ):
        raw = resp.iter_raw()
        received = len(next(raw))

        def stalled() -> bool:
            before = sim_stats(env.a)["tokens_sent"]
            time.sleep(0.3)
            return sim_stats(env.a)["tokens_sent"] == before

        assert wait_until(stalled, timeout=10.0)
        held_at = sim_stats(env.a)["tokens_sent"]
        assert held_at < total, "the region was never held back"
        received += sum(len(piece) for piece in raw)
    assert received > total * pad
    assert sim_stats(env.a)["tokens_sent"] == total
