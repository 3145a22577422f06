"""Broken regions: what the client sees, that nothing hangs past its deadline, and that the router
keeps serving afterwards."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests

from tests.faults.conftest import BadFactory
from tests.integration.conftest import MODEL, RouterFactory, SimFactory, region_toml
from tests.support import Proc

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
TIMEOUTS = "[timeouts]\nconnect = 1.0\nfirst_byte = 1.5\nidle = 1.5\ntotal = 4.0\n"


def _router(router_proc: RouterFactory, *regions: Proc, extra: str = "") -> Proc:
    body = "".join(region_toml(proc, bias_ms=float(10 * i)) for i, proc in enumerate(regions))
    return router_proc(TIMEOUTS + extra + "[auth]\nenabled = false\n" + body)


def _post(router: Proc, payload: dict[str, Any], timeout: float = 20.0) -> requests.Response:
    return requests.post(router.url + "/v1/chat/completions", json=payload, timeout=timeout)


def _error_shape(resp: requests.Response) -> dict[str, Any]:
    error: dict[str, Any] = resp.json()["error"]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert "type" in error
    assert "code" in error
    return error


def _sse_events(text: str) -> list[Any]:
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


def _still_serving(router: Proc, sim: Proc) -> None:
    resp = _post(router, CHAT)
    assert resp.status_code == 200, resp.text[:300]
    assert resp.headers["x-router-region"] == sim.name  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["blackhole", "html", "badjson", "big"])
def test_broken_region_fails_over_before_first_byte(
    mode: str, bad_upstream: BadFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    bad = bad_upstream(mode)
    good = sim_region("good")
    router = _router(router_proc, bad, good)
    for _ in range(3):
        resp = _post(router, CHAT)
        assert resp.status_code == 200, resp.text[:300]
        assert resp.json()["object"] == "chat.completion"
        assert resp.headers["x-router-region"] == "good"


@pytest.mark.parametrize("mode", ["blackhole", "html", "badjson", "big", "drip"])
def test_broken_only_region_gives_openai_error_within_deadline(
    mode: str, bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    bad = bad_upstream(mode)
    router = _router(router_proc, bad)
    began = time.monotonic()
    resp = _post(router, CHAT)
    elapsed = time.monotonic() - began
    assert resp.status_code in (502, 504), resp.text[:300]
    _error_shape(resp)
    # [timeouts] total = 4 s bounds every attempt; far less than the client's 20 s.
    assert elapsed < 12, elapsed


@pytest.mark.parametrize("mode", ["badsse", "nodone", "drip"])
def test_broken_stream_ends_with_error_event_never_looks_complete(
    mode: str, bad_upstream: BadFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    bad = bad_upstream(mode)
    router = _router(router_proc, bad)
    began = time.monotonic()
    resp = _post(router, {**CHAT, "stream": True})
    assert time.monotonic() - began < 12
    if resp.status_code != 200:
        # Rejected before the first byte (the region's first event was unusable): an error shape.
        assert resp.status_code in (502, 504), resp.text[:300]
        _error_shape(resp)
    else:
        events = _sse_events(resp.text)
        assert events, resp.text[:300]
        assert events[-1] != "[DONE]", "a broken stream must not end like a complete one"
        last = json.loads(events[-1])
        assert last["error"]["message"], last
    # The router itself is unharmed.
    good = sim_region("good")
    healthy = _router(router_proc, good)
    _still_serving(healthy, good)
    assert requests.get(router.url + "/healthz", timeout=5).status_code == 200


def _content(events: list[str]) -> str:
    text = ""
    for event in events:
        if event != "[DONE]":
            for choice in json.loads(event).get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    return text


@pytest.mark.parametrize("mode", ["splitstart", "bom", "strayline", "noblank"])
def test_a_whole_stream_at_the_edges_of_sse_is_relayed_whole(
    mode: str, bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    """A first read cut inside `data:`, a byte order mark, a stray newline after the end, a
    `[DONE]` without its blank line: each a whole answer, once, never an error or a 502."""
    router = _router(router_proc, bad_upstream(mode))
    resp = _post(router, {**CHAT, "stream": True})
    assert resp.status_code == 200, resp.text[:300]
    events = _sse_events(resp.text)
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1
    assert not [e for e in events if '"error"' in e]
    assert _content(events) == "Hello there"


@pytest.mark.parametrize("mode", ["keepalive", "errorevent"])
def test_a_region_without_a_token_is_left_for_another(
    mode: str, bad_upstream: BadFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    """Keep-alive comments are no first token; an error event before any is a failure."""
    bad = bad_upstream(mode)
    good = sim_region("good")
    router = _router(router_proc, bad, good, extra="[routing]\nstream_ttft_timeout_s = 0.5\n")
    resp = _post(router, {**CHAT, "stream": True})
    assert resp.status_code == 200, resp.text[:300]
    assert resp.headers["x-router-region"] == "good"
    events = _sse_events(resp.text)
    assert events[-1] == "[DONE]"
    assert not [e for e in events if '"error"' in e]


def test_a_whole_answer_whose_body_stalls_fails_over_after_the_idle_timeout(
    bad_upstream: BadFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    # The body read had no bound but timeouts.total (600 s by default): a region that sent a
    # head and a few bytes held the request that long. Now a pause of timeouts.idle fails it.
    bad = bad_upstream("stallbody")
    good = sim_region("good")
    timeouts = "[timeouts]\nconnect = 1.0\nfirst_byte = 1.5\nidle = 1.0\ntotal = 120.0\n"
    body = region_toml(bad) + region_toml(good, bias_ms=10.0)
    router = router_proc(timeouts + "[auth]\nenabled = false\n" + body)
    resp = _post(router, CHAT, timeout=30.0)  # the old bound, total, is 120 s
    assert resp.status_code == 200, resp.text[:300]
    assert resp.headers["x-router-region"] == "good"
    assert "the body stalled" in router.wait_output("the body stalled")
