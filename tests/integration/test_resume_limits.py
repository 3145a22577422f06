"""Mid-stream resume with real processes where it must not carry on (a tool call, several
choices) and where nothing is left to ask for (cut after the last allowed token). Each test
failed before its fix."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.conftest import (
    MODEL,
    RouterFactory,
    SimFactory,
    region_toml,
    sim_stats,
)
from tests.support import Proc, stream_text

RESUME = '[routing]\nmidstream = "resume"\n[auth]\nenabled = false\n'
USER = [{"role": "user", "content": "Tell me a story"}]


def _stream(proc: Proc, body: dict[str, Any]) -> list[Any]:
    """A chat stream's payloads: each event's JSON, or "[DONE]"."""
    raw = stream_text(proc.url + "/v1/chat/completions", {"model": MODEL, **body})
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


def _events(proc: Proc, path: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A Responses or Messages stream's (event name, data) pairs."""
    raw = stream_text(proc.url + path, {"model": MODEL, **body})
    out = []
    for block in raw.split("\n\n"):
        lines = block.splitlines()
        names = [line[7:] for line in lines if line.startswith("event: ")]
        data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        if data:
            out.append((names[0] if names else "", data[0]))
    return out


def test_typed_event_streams_cut_after_their_last_allowed_token_end_for_length(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    """A Responses or Messages stream cut after its last allowed token (the region's end events
    lost) ends as the region ends one at the limit: `response.incomplete` (max_output_tokens),
    or a message_delta saying max_tokens then message_stop; no region is asked for more."""
    router, b = _two(sim_region, router_proc, "vllm", 5)
    fresh = sim_region("c", kind="vllm")  # vLLM's events at the limit, nothing cut
    for path, asked in (
        ("/v1/responses", {"input": "Tell me a story", "max_output_tokens": 5, "store": False}),
        ("/v1/messages", {"messages": USER, "max_tokens": 5}),
    ):
        direct = _events(fresh, path, asked)
        events = _events(router, path, asked)
        assert [n for n, _ in events] == [n for n, _ in direct], path
        assert events[-1][0] in ("response.incomplete", "message_stop"), path
        if path == "/v1/responses":
            final, whole = events[-1][1]["response"], direct[-1][1]["response"]
            assert final["status"] == "incomplete"
            assert final["incomplete_details"] == {"reason": "max_output_tokens"}
            assert final["output"] == whole["output"]
            assert final["id"] == events[0][1]["response"]["id"]
            assert final["usage"]["output_tokens"] == 5
            numbers = [e["sequence_number"] for _, e in events]
            assert numbers == list(range(len(events)))
            deltas = [e["delta"] for n, e in events if n == "response.output_text.delta"]
            assert events[-4][1]["text"] == "".join(deltas)  # response.output_text.done
        else:
            said = next(e for n, e in events if n == "message_delta")
            assert said["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
            assert said["usage"]["output_tokens"] == 5
        assert sim_stats(b)["by_path"].get(path, 0) == 0, path  # never asked for a sixth token
