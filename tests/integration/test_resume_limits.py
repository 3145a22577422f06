"""Mid-stream resume with real processes where it must not carry on (a tool call, several
choices) and where nothing is left to ask for (cut after the last allowed token). Each test
failed before its fix."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from tests.integration.conftest import (
    MODEL,
    RouterFactory,
    SimFactory,
    region_toml,
    sim_stats,
)
from tests.support import Proc

RESUME = '[routing]\nmidstream = "resume"\n[auth]\nenabled = false\n'
USER = [{"role": "user", "content": "Tell me a story"}]


def _stream(proc: Proc, body: dict[str, Any]) -> list[Any]:
    """A chat stream's payloads: each event's JSON, or "[DONE]"."""
    request = urllib.request.Request(
        proc.url + "/v1/chat/completions",
        data=json.dumps({"model": MODEL, "stream": True, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=20) as resp:
        assert resp.status == 200
        raw = resp.read().decode()
    return [
        line[6:] if line == "data: [DONE]" else json.loads(line[6:])
        for line in raw.splitlines()
        if line.startswith("data: ")
    ]


def _chat_asked(proc: Proc) -> int:
    return int(sim_stats(proc)["by_path"].get("/v1/chat/completions", 0))


def _two(sim_region: SimFactory, router_proc: RouterFactory, kind: str, after: int) -> Any:
    """Region a cuts every stream after `after` tokens; b (further) would carry them on."""
    a = sim_region("a", kind=kind, fail_mode="die-mid-stream", after_tokens=after)
    b = sim_region("b", kind=kind)
    router = router_proc(
        RESUME + region_toml(a, kind=kind) + region_toml(b, kind=kind, bias_ms=500)
    )
    return router, b


def test_a_stream_cut_inside_a_tool_call_is_not_continued_as_text(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router, b = _two(sim_region, router_proc, "vllm", 3)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    events = _stream(router, {"messages": USER, "tools": tools, "tool_choice": "required"})
    calls = [c["delta"].get("tool_calls") for e in events[:-1] for c in e["choices"]]
    assert calls[0][0]["function"]["name"] == "get_weather"
    assert len(calls) == 4  # the call opened, 3 pieces of its arguments
    # The router's failure event, no [DONE]: never an open call followed by another's text.
    assert events[-1]["error"]["code"] == "upstream_stream_error"
    assert "[DONE]" not in events
    assert not any(c["delta"].get("content") for e in events[:-1] for c in e["choices"])
    assert _chat_asked(b) == 0


def test_a_stream_of_llama_cpps_n_cmpl_choices_is_not_continued(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router, b = _two(sim_region, router_proc, "llama-server", 3)
    events = _stream(router, {"messages": USER, "n_cmpl": 2, "temperature": 0})
    indexes = {c["index"] for e in events[:-1] for c in e["choices"]}
    assert indexes == {0, 1}
    assert events[-1]["error"]["code"] == "upstream_stream_error"
    assert _chat_asked(b) == 0


def test_a_stream_cut_after_its_last_allowed_token_ends_for_length(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    # llama-server sends finish_reason "length" in a chunk of its own after the last token;
    # the sim cuts between them.
    router, b = _two(sim_region, router_proc, "llama-server", 5)
    fresh = sim_region("c", kind="llama-server")
    asked: dict[str, Any] = {
        "messages": USER,
        "max_tokens": 5,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    direct = _stream(fresh, asked)
    events = _stream(router, asked)
    texts = [c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"]]
    direct_texts = [c["delta"].get("content") or "" for e in direct[:-1] for c in e["choices"]]
    assert "".join(texts) == "".join(direct_texts)
    finishes = [c["finish_reason"] for e in events[:-1] for c in e["choices"]]
    assert finishes[-1] == "length"
    assert finishes.count("length") == 1
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert events[-1] == "[DONE]"
    assert len({e["id"] for e in events[:-1]}) == 1
    assert _chat_asked(b) == 0  # never asked for a sixth token
