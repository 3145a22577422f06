"""The simulated region as the real servers it stands in for (`--kind`): their quirks, and the
router in front of them. tests/real pins the same behaviours on the real servers."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator

import httpx2 as httpx
import pytest

from router.sim import text
from tests.integration.conftest import MODEL, RouterFactory, region_toml, sim_stats, start_sim
from tests.support import Proc

MESSAGES = [{"role": "user", "content": "Tell me about kinds."}]


@pytest.fixture(scope="module")
def lcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_sim(tmp_path_factory.mktemp("lcp"), "lcp", kind="llama-cpp-python")
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def ls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_sim(tmp_path_factory.mktemp("ls"), "ls", kind="llama-server")
    yield proc
    proc.kill()


def post(proc: Proc, headers: dict[str, str] | None = None, **body: object) -> httpx.Response:
    payload = {"model": MODEL, "messages": MESSAGES, **body}
    return httpx.post(proc.url + "/v1/chat/completions", json=payload, headers=headers, timeout=20)


def data(resp: httpx.Response) -> list[str]:
    return [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]


def test_llama_cpp_python_refuses_request_ids_that_are_not_uuids(lcp: Proc) -> None:
    refused = post(lcp, {"X-Request-Id": "req-123"})
    assert (refused.status_code, refused.content) == (400, b"")
    assert post(lcp, {"X-Request-Id": str(uuid.uuid4())}).status_code == 200


def test_llama_cpp_python_opens_a_new_turn_after_a_prefill(lcp: Proc) -> None:
    full = text.full_chat_text(MODEL, MESSAGES)
    prefill = full[: len(full) // 2]
    messages = [*MESSAGES, {"role": "assistant", "content": prefill}]
    got = post(lcp, messages=messages).json()["choices"][0]["message"]["content"]
    assert got != full[len(prefill) :]


def test_llama_server_answers_the_prefill_back_first(ls: Proc) -> None:
    full = text.full_chat_text(MODEL, MESSAGES)
    prefill = full[: len(full) // 2]
    messages = [*MESSAGES, {"role": "assistant", "content": prefill}]
    got = post(ls, messages=messages).json()["choices"][0]["message"]["content"]
    assert got == full


def test_llama_cpp_python_ignores_include_usage_and_overflows_into_an_empty_200(
    lcp: Proc,
) -> None:
    asked = post(lcp, stream=True, stream_options={"include_usage": True})
    assert not any('"usage": {' in d or '"usage":{' in d for d in data(asked))
    long = [{"role": "user", "content": "sea " * 5000}]
    empty = post(lcp, messages=long, stream=True)
    assert (empty.status_code, empty.content) == (200, b"")


def test_llama_cpp_python_cuts_a_running_stream_for_a_new_request(lcp: Proc) -> None:
    slow = {"x-sim-tokens-per-s": "20"}
    out: list[httpx.Response] = []
    streaming = threading.Thread(target=lambda: out.append(post(lcp, slow, stream=True)))
    streaming.start()
    time.sleep(0.5)
    assert post(lcp, max_tokens=2).status_code == 200
    streaming.join()
    events = data(out[0])
    assert events[-1] == "[DONE]"
    finishes = [c.get("finish_reason") for e in events[:-1] for c in json.loads(e)["choices"]]
    assert not any(finishes)  # it ends like a clean stream, without having finished


def test_the_router_in_front_of_llama_cpp_python(lcp: Proc, router_proc: RouterFactory) -> None:
    router = router_proc("[auth]\nenabled = false\n" + region_toml(lcp, kind="llama-cpp-python"))
    # A UUID goes upstream whatever the client sent.
    resp = post(router, {"X-Request-Id": "req-123"})
    assert resp.status_code == 200
    assert resp.headers["x-request-id"] == "req-123"
    # An interrupted stream never reaches the client looking complete.
    out: list[httpx.Response] = []
    slow = {"x-sim-tokens-per-s": "20"}
    streaming = threading.Thread(target=lambda: out.append(post(router, slow, stream=True)))
    streaming.start()
    time.sleep(0.5)
    post(lcp, max_tokens=2)  # another client of the same server
    streaming.join()
    events = data(out[0])
    assert events[-1] != "[DONE]"
    assert json.loads(events[-1])["error"]["code"] == "upstream_stream_error"


def wait_healthy(router: Proc, region: str) -> None:
    """Poll the router's /status.json until `region` is healthy (its first probe answered)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        regions = httpx.get(router.url + "/status.json", timeout=5).json()["regions"]
        if any(r["name"] == region and r["healthy"] for r in regions):
            return
        time.sleep(0.1)
    raise AssertionError(f"region {region} never became healthy")


def test_llama_cpp_python_answers_a_body_it_cannot_take_with_a_500_quoting_its_check(
    lcp: Proc,
) -> None:
    wizard = post(lcp, messages=[{"role": "wizard", "content": "x"}])
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    formatted = post(lcp, response_format=schema)
    for resp in (wizard, formatted):
        assert resp.status_code == 500
        error = resp.json()["error"]
        assert error["type"] == "internal_server_error"
        assert "validation error" in error["message"]
        assert "'loc': ('body'," in error["message"]


def test_the_router_takes_llama_cpp_pythons_500_for_a_request_error_not_a_region_failure(
    lcp: Proc, ls: Proc, router_proc: RouterFactory
) -> None:
    """Issue: its 500s for a body it cannot take were retried, failed over on the retry budget
    and opened its circuit, after which even plain requests went elsewhere."""
    router = router_proc(
        "[auth]\nenabled = false\n[routing]\ncircuit_after = 2\n"
        + region_toml(lcp, kind="llama-cpp-python")
        + region_toml(ls, kind="llama-server", bias_ms=500)
    )
    wait_healthy(router, "lcp")
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    asked = sim_stats(lcp)["requests"]
    for _ in range(4):
        # llama-server takes what llama-cpp-python cannot: its answer, in one retry-free step.
        resp = post(router, response_format=schema)
        assert (resp.status_code, resp.headers["x-router-region"]) == (200, "ls")
    assert sim_stats(lcp)["requests"] - asked == 4  # each asked once, never again
    # Nothing was held against llama-cpp-python: plain requests still go there first.
    resp = post(router)
    assert (resp.status_code, resp.headers["x-router-region"]) == (200, "lcp")
    # With no other region: one clear 400 quoting it (not its 500, which SDKs retry), asked once.
    alone = router_proc("[auth]\nenabled = false\n" + region_toml(lcp, kind="llama-cpp-python"))
    resp = post(alone, messages=[{"role": "wizard", "content": "x"}])
    assert resp.status_code == 400
    assert resp.headers["x-router-attempts"] == "1"
    error = resp.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_by_region")
    assert "Input should be 'user'" in error["message"]
