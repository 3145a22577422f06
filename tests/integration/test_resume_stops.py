"""Mid-stream resume with the request's `stop` strings, real processes: the answer ends where one
uninterrupted run would have, whether the stop string lies in the continuation (the region
continuing sees it) or began in the text the client had (only the router sees that)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.sim import text
from tests.integration.conftest import MODEL, RouterFactory, SimFactory, region_toml, sim_stats
from tests.support import Proc, stream_text

RESUME = '[routing]\nmidstream = "resume"\n[auth]\nenabled = false\n'
CUT = 4  # region a cuts every stream after this many tokens


def _stream(proc: Proc, path: str, body: dict[str, Any]) -> tuple[str, list[str], Any, set[str]]:
    """(text, finish reasons, the last usage, chunk ids) of a chat or completions stream."""
    raw = stream_text(proc.url + path, {"model": MODEL, **body})
    said, finishes, usage, ids = "", [], None, set()
    lines = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    for chunk in map(json.loads, lines[:-1]):
        ids.add(chunk["id"])
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            said += (choice["delta"].get("content") if "delta" in choice else choice["text"]) or ""
            if choice["finish_reason"]:
                finishes.append(choice["finish_reason"])
    return said, finishes, usage, ids


def _asked(api: str, i: int) -> tuple[str, dict[str, Any], list[str]]:
    """(path, request without `stop`, the tokens the sim answers it with)."""
    if api in ("chat", "messages"):
        messages = [{"role": "user", "content": f"Tell me story {i}"}]
        tokens = text.chat_tokens(MODEL, messages)[0]
        if api == "messages":
            return "/v1/messages", {"messages": messages, "max_tokens": 100}, tokens
        body = {"messages": messages, "stream_options": {"include_usage": True}}
        return "/v1/chat/completions", body, tokens
    prompt = f"Story number {i}:"
    return "/v1/completions", {"prompt": prompt}, text.completion_tokens(MODEL, prompt)


def _stop_at(api: str, across: bool) -> tuple[str, dict[str, Any], str]:
    """A request and a stop string first found across the seam (its start in the text the client
    has when a cuts, its end in the first token after), or first found whole after it."""
    for i in range(200):
        path, body, tokens = _asked(api, i)
        had, after = "".join(tokens[:CUT]), "".join(tokens[: CUT + 3])
        stop = had[-2:] + tokens[CUT][:3] if across else tokens[CUT + 2][1:4]
        if after.find(stop) == (len(had) - 2 if across else len(after) - len(tokens[CUT + 2]) + 1):
            return path, body, stop
    raise AssertionError("no such request")


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("across", [True, False], ids=["across-the-seam", "after-the-seam"])
def test_a_continued_stream_stops_where_one_run_would_have(
    api: str, across: bool, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    a = sim_region("a", fail_mode="die-mid-stream", after_tokens=CUT)
    b = sim_region("b")
    fresh = sim_region("c")  # one uninterrupted run
    router = router_proc(RESUME + region_toml(a) + region_toml(b, bias_ms=500))
    path, body, stop = _stop_at(api, across)
    asked = {**body, "stop": [stop], "temperature": 0}
    direct, direct_finishes, direct_usage, _ = _stream(fresh, path, asked)
    said, finishes, usage, ids = _stream(router, path, asked)
    assert stop not in direct
    assert direct_finishes == ["stop"]
    assert (said, finishes) == (direct, ["stop"])
    assert len(ids) == 1
    continued = json.loads(sim_stats(b)["last_body"])
    assert continued["stop"] == [stop]  # the region continuing stops at one in its own text
    if api == "chat":
        assert usage["completion_tokens"] == direct_usage["completion_tokens"]


def _message_stream(proc: Proc, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """(text, events) of a Messages stream."""
    raw = stream_text(proc.url + "/v1/messages", {"model": MODEL, **body})
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    said = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    return said, events


@pytest.mark.parametrize("across", [True, False], ids=["across-the-seam", "after-the-seam"])
def test_a_continued_message_stops_at_its_stop_sequence_where_one_run_would_have(
    across: bool, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    a = sim_region("a", fail_mode="die-mid-stream", after_tokens=CUT)
    b = sim_region("b")
    fresh = sim_region("c")
    router = router_proc(RESUME + region_toml(a) + region_toml(b, bias_ms=500))
    _, body, stop = _stop_at("messages", across)
    asked = {**body, "stop_sequences": [stop], "temperature": 0}
    direct, direct_events = _message_stream(fresh, asked)
    said, events = _message_stream(router, asked)
    assert stop not in direct
    assert said == direct
    assert [e["type"] for e in events] == [e["type"] for e in direct_events]
    ended = next(e for e in events if e["type"] == "message_delta")
    assert ended["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    direct_end = next(e for e in direct_events if e["type"] == "message_delta")
    assert ended == direct_end
    assert json.loads(sim_stats(b)["last_body"])["stop_sequences"] == [stop]
