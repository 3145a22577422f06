"""A region that ends its SSE lines with a lone CR (legal SSE, `router sim-region --sse-line-end
cr`): its streams relayed as sent, their usage read, cached and replayed, and continued
elsewhere when they break, as an LF region's are."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.sim import text
from tests.integration.conftest import (
    MODEL,
    RouterFactory,
    SimFactory,
    region_toml,
    sim_stats,
)
from tests.integration.test_failover import chunk_text, stream_chunks
from tests.integration.test_metrics import call, samples, value

HEADER = """
[timeouts]
connect = 1.0
first_byte = 5.0
idle = 5.0

[auth]
enabled = false
"""


def read(raw: bytes) -> tuple[str, list[dict[str, Any]], int, int]:
    """(text, chunks, [DONE] count, error events) of an SSE body, its lines ended by CR LF, LF
    or CR."""
    chunks, done, errors = stream_chunks(raw)
    return chunk_text(chunks), chunks, done, errors


def test_a_cr_framed_stream_is_relayed_whole_its_usage_read_and_replayed_from_the_cache(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    a = sim_region("a", sse_line_end="cr")
    router = router_proc(HEADER + "\n[cache]\nenabled = true\n" + region_toml(a))
    messages = [{"role": "user", "content": "frame me with carriage returns"}]
    body = {
        "model": MODEL,
        "messages": messages,
        "stream": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    first = call(router.url + "/v1/chat/completions", body)
    assert first.status == 200, first.body
    assert first.headers["x-cache"] == "MISS"
    # The region's bytes as it sent them: every line ended by a lone CR.
    assert b"\r" in first.body
    assert b"\n" not in first.body
    streamed, chunks, done, errors = read(first.body)
    assert (done, errors) == (1, 0)
    assert streamed == text.full_chat_text(MODEL, messages)
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] > 0
    # The router read the usage the stream reported.
    (line,) = router.access_lines(1)
    assert (line.get("tokens_in"), line.get("tokens_out")) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    m = samples(router)
    spent = value(m, "router_tokens_total", model=MODEL, region="a", direction="out")
    assert spent == usage["completion_tokens"]
    # Recorded whole, so the same request is a hit replaying the same chunks.
    second = call(router.url + "/v1/chat/completions", body)
    assert second.status == 200, second.body
    assert second.headers["x-cache"] == "HIT"
    assert read(second.body) == (streamed, chunks, 1, 0)
    assert sim_stats(a)["streams"] == 1


@pytest.mark.parametrize("next_line_end", ["cr", "lf"])
def test_a_cr_framed_stream_cut_mid_way_is_continued_on_the_next_region(
    sim_region: SimFactory, router_proc: RouterFactory, next_line_end: str
) -> None:
    a = sim_region("a", sse_line_end="cr", tokens_per_s=200)
    b = sim_region("b", sse_line_end=next_line_end, tokens_per_s=200)
    config = HEADER + '\n[routing]\nmidstream = "resume"\n'
    router = router_proc(config + region_toml(a) + region_toml(b, bias_ms=30.0))
    messages = [{"role": "user", "content": "Cut me after five tokens, then carry on."}]
    body = {"model": MODEL, "messages": messages, "stream": True}
    headers = {"x-sim-fail": "die-mid-stream", "x-sim-only": "a", "x-sim-after-tokens": "5"}
    answer = call(router.url + "/v1/chat/completions", body, headers)
    assert answer.status == 200, answer.body
    assert answer.headers["x-router-region"] == "a"
    streamed, chunks, done, errors = read(answer.body)
    assert (done, errors) == (1, 0)
    whole = text.full_chat_text(MODEL, messages)
    assert streamed == whole
    # One stream to the client: the continuation carries the first stream's id.
    assert len({chunk["id"] for chunk in chunks}) == 1
    # b went on from the five tokens a had sent (read from a's CR-framed events).
    sent = json.loads(sim_stats(b)["last_body"])
    had = sent["messages"][-1]
    assert had["role"] == "assistant"
    assert had["content"]
    assert whole.startswith(had["content"])
    assert had["content"] == "".join(text.chat_tokens(MODEL, messages)[0][:5])
