"""Responses and Messages streams through the pipeline, regions in process (LocalTransport):
how they end when the region misbehaves, their errors, their continuation."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from router.config import RoutingConfig
from router.core.request import MESSAGES, RESPONSES
from router.core.transport import LocalReply
from tests.unit.core.test_pipeline import JSON, SSE, app_for


def ev(name: str, **data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


def events_of(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(json.loads(line[6:]))
    return out


OPENING = [
    ev("response.created", response={"id": "resp_1"}, sequence_number=0),
    ev("response.output_item.added", item={"type": "message", "id": "msg_1"}, sequence_number=1),
]
ASK = {"model": "m", "input": "hi", "store": False, "stream": True}


async def test_a_responses_stream_ended_before_its_terminal_event_fails() -> None:
    async def region(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        assert path == "/v1/responses"
        # A clean end of the body, but no response.completed: never a complete-looking stream.
        return LocalReply(
            200,
            SSE,
            [
                *OPENING,
                b"data: {not json\n\n",  # an invalid event: dropped
                ev("response.output_text.delta", delta="Hi", sequence_number=2),
            ],
        )

    app, _ = app_for({"a": region})
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(RESPONSES, json=ASK)
        raw = await resp.read()
    assert b"not json" not in raw
    assert b"[DONE]" not in raw
    events = events_of(raw)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.output_item.added",
        "response.output_text.delta",
        "response.failed",
    ]
    failed = events[-1]
    assert failed["sequence_number"] == 3
    assert failed["response"]["id"] == "resp_1"
    assert "terminal event" in failed["response"]["error"]["message"]


async def test_region_errors_on_messages_reach_the_client_in_anthropics_shape() -> None:
    async def busy(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(429, JSON, [b'{"error": {"message": "slow down", "type": "x"}}'])

    app, _ = app_for({"a": busy, "b": busy})
    ask = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(MESSAGES, json=ask)
        assert resp.status == 429
        assert await resp.json() == {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "slow down"},
        }
        resp = await client.post(MESSAGES, data=b"{", headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_a_cut_messages_stream_continues_with_the_echo_dropped() -> None:
    async def breaks(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            yield ev("message_start", message={"id": "msg_a", "usage": {"input_tokens": 3}})
            yield ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
            yield ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hel"})
            yield ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "lo"})
            raise ConnectionResetError("region died")

        return LocalReply(200, SSE, chunks())

    async def continues(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        sent = json.loads(raw)
        assert sent["messages"][-1] == {"role": "assistant", "content": "Hello"}
        assert sent["max_tokens"] == 98  # two tokens were sent already
        text = {"type": "text_delta"}
        return LocalReply(
            200,
            SSE,
            [
                ev("message_start", message={"id": "msg_b", "usage": {"input_tokens": 5}}),
                ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                # llama-server answers the prefill back first.
                ev("content_block_delta", index=0, delta={**text, "text": "Hello"}),
                ev("content_block_delta", index=0, delta={**text, "text": " world"}),
                ev("content_block_stop", index=0),
                ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}),
                ev("message_stop"),
            ],
        )

    routing = RoutingConfig(midstream="resume")
    app, _ = app_for({"a": breaks, "b": continues}, routing, kind="llama-server")
    ask = {
        "model": "m",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(MESSAGES, json=ask)
        raw = await resp.read()
    events = events_of(raw)
    kinds = [e["type"] for e in events]
    assert kinds.count("message_start") == 1
    assert events[0]["message"]["id"] == "msg_a"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "Hello world"
    assert kinds[-1] == "message_stop"
    usage = next(e["usage"] for e in events if e["type"] == "message_delta")
    assert usage == {"output_tokens": 3}  # the whole answer: 2 sent + 1 continued
    # Every event keeps its name line (the Anthropic SDKs read nothing without one).
    assert raw.count(b"event: ") == len(events)
