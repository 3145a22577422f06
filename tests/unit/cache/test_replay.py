"""A cached stream replays as it was relayed, whatever its events' framing: an event whose data
spans several `data:` lines (legal SSE, the payload its lines joined by LF) reaches a hit and a
coalesced follower as it reached the first client, in every API (regions in process)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from multidict import CIMultiDict

from router.core.request import CHAT, MESSAGES, RESPONSES
from router.core.transport import LocalReply
from router.net import sse
from tests.unit.cache.test_coalesced import ask, burst, cached, joined
from tests.unit.core.test_pipeline import SSE, Handler


def spec_events(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, data as JSON) per event, read as the SSE spec says (lines joined by LF)."""
    out: list[tuple[str | None, Any]] = []
    for block in raw.decode().split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                data.append(value)
            elif field == "event":
                name = value
        if data and data != ["[DONE]"]:
            out.append((name, json.loads("\n".join(data))))
    return out


def two_lines(event: bytes) -> bytes:
    """`event` with its JSON data cut after its first colon onto a second `data:` line."""
    head, _, payload = event.rstrip(b"\n").rpartition(b"data: ")
    cut = payload.index(b":") + 1
    return head + b"data: " + payload[:cut] + b"\ndata: " + payload[cut:] + b"\n\n"


def _chat() -> list[bytes]:
    def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return sse.encode(json.dumps({"id": "c", "choices": [choice]}).encode())

    events = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"})]
    events += [chunk({"content": "lo"}), chunk({}, "stop")]
    return [*map(two_lines, events), b"data: [DONE]\n\n"]


def _typed(name: str, **data: Any) -> bytes:
    return two_lines(f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode())


STREAMS = {
    CHAT: _chat(),
    RESPONSES: [
        _typed("response.created", response={"id": "resp_1"}, sequence_number=0),
        _typed("response.output_text.delta", delta="Hello", sequence_number=1),
        _typed("response.completed", response={"id": "resp_1"}, sequence_number=2),
    ],
    MESSAGES: [
        _typed("message_start", message={"id": "msg_1"}),
        _typed("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hello"}),
        _typed("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}),
        _typed("message_stop"),
    ],
}


def region(endpoint: str, release: asyncio.Event | None = None) -> Handler:
    """Streams its API's answer in two-line events (after `release`, from its second event)."""

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            for i, event in enumerate(STREAMS[endpoint]):
                if i == 1 and release is not None:
                    await release.wait()
                yield event

        return LocalReply(200, SSE, chunks())

    return handle


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES, MESSAGES])
async def test_a_hit_replays_multi_line_events_as_they_were_relayed(endpoint: str) -> None:
    async with cached({"a": region(endpoint)}) as (client, _, transports):
        got = []
        for outcome in ("MISS", "HIT"):
            async with client.post(endpoint, json=ask(endpoint)) as resp:
                assert resp.headers["x-cache"] == outcome
                got.append(spec_events(await resp.read()))
    assert len(transports["a"].requests) == 1
    miss, hit = got
    assert hit == miss
    assert len(miss) == len(STREAMS[endpoint]) - (endpoint == CHAT)  # [DONE] aside


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES, MESSAGES])
async def test_a_coalesced_follower_gets_multi_line_events_as_they_were_relayed(
    endpoint: str,
) -> None:
    release = asyncio.Event()
    async with cached({"a": region(endpoint, release)}) as (client, cache, transports):
        answers = asyncio.create_task(burst(client, endpoint, ask(endpoint), 3))
        await joined(cache, 2)
        release.set()
        got = await answers
    assert len(transports["a"].requests) == 1
    assert sorted(a[3] or "" for a in got) == ["HIT", "HIT", "MISS"]
    leader = next(spec_events(a[4]) for a in got if a[3] == "MISS")
    assert len(leader) == len(STREAMS[endpoint]) - (endpoint == CHAT)
    for answer in got:
        assert spec_events(answer[4]) == leader
