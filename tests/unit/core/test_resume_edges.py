"""Streams mid-stream resume must not carry on, and one cut with nothing left to ask for, in
process (the pipeline before in-process regions): each test failed before its fix."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from router.config import RoutingConfig
from router.core.request import CHAT, COMPLETIONS, MESSAGES, RESPONSES
from router.core.transport import LocalReply
from tests.unit.core.test_event_streams import ev, events_of
from tests.unit.core.test_pipeline import SSE, Handler, app_for, body, delta, event, texts

RESUME = RoutingConfig(midstream="resume")


def chunk(**fields: Any) -> bytes:
    choice = {"index": 0, "delta": fields, "finish_reason": None}
    return event({"id": "chatcmpl-a", "created": 1, "model": "m", "choices": [choice]})


def breaks_after(*events: bytes) -> Handler:
    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            for item in events:
                yield item
            raise ConnectionResetError("region died")

        return LocalReply(200, SSE, chunks())

    return handle


async def carries_on(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
    end = {"index": 0, "delta": {}, "finish_reason": "stop"}
    return LocalReply(
        200, SSE, [delta(" more"), event({"id": "b", "choices": [end]}), b"data: [DONE]\n\n"]
    )


async def post(
    first: Handler, endpoint: str, payload: dict[str, Any], kind: str = "vllm"
) -> tuple[bytes, int]:
    """The client's body, and how many requests the second region got."""
    app, transports = app_for({"a": first, "b": carries_on}, RESUME, kind=kind)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(endpoint, json=payload)
        assert resp.status == 200
        raw = await resp.read()
    return raw, len(transports["b"].requests)


CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}


@pytest.mark.parametrize(
    "sent",
    [
        [
            chunk(tool_calls=[CALL]),
            chunk(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]),
        ],
        [delta("Let me check. "), chunk(tool_calls=[CALL])],
        [chunk(function_call={"name": "f", "arguments": '{"ci'})],
        [chunk(reasoning_content="Think "), delta("Answer")],
        [chunk(reasoning="Think ")],
        [chunk(refusal="I can")],
        [chunk(audio={"id": "a1", "data": "AAAA"})],
    ],
    ids=[
        "tool-call",
        "text-then-tool-call",
        "function-call",
        "reasoning",
        "reasoning-vllm",
        "refusal",
        "audio",
    ],
)
async def test_a_chat_stream_that_sent_more_than_text_is_not_continued(sent: list[bytes]) -> None:
    raw, asked = await post(breaks_after(*sent), CHAT, body(stream=True, temperature=0))
    # A prefill carries text only: "continued", the tool call would be left open and text
    # from another region follow it.
    assert texts(raw)[1] == ["upstream_stream_error"]
    assert asked == 0


async def test_empty_non_text_fields_leave_a_text_stream_resumable() -> None:
    sent = [chunk(content="Hel", tool_calls=[], reasoning_content=None), delta("lo")]
    raw, asked = await post(breaks_after(*sent), CHAT, body(stream=True))
    assert texts(raw) == ("Hello more", [])
    assert asked == 1


@pytest.mark.parametrize(
    ("choices", "continued"),
    [(2, False), ("2", False), (1, True), (1.0, True), ("x", False)],
)
async def test_llama_cpps_n_cmpl_of_more_than_one_choice_is_not_continued(
    choices: object, continued: bool
) -> None:
    payload = body(stream=True, n_cmpl=choices)
    raw, asked = await post(breaks_after(delta("Hel"), delta("lo")), CHAT, payload)
    assert asked == int(continued)
    assert texts(raw) == (("Hello more", []) if continued else ("Hello", ["upstream_stream_error"]))


@pytest.mark.parametrize("n_predict", [7.5, "x", "7 tokens"])
@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
async def test_a_length_the_router_cannot_read_is_not_continued(
    n_predict: object, endpoint: str
) -> None:
    # llama-server reads n_predict first: unlowered, the continuation could go past it.
    if endpoint == CHAT:
        payload, first = body(stream=True, n_predict=n_predict), breaks_after(delta("Hel"))
    else:
        payload = {"model": "m", "prompt": "The sea", "stream": True, "n_predict": n_predict}
        text = {"index": 0, "text": " is", "finish_reason": None}
        first = breaks_after(event({"id": "cmpl-a", "choices": [text]}))
    raw, asked = await post(first, endpoint, payload, kind="llama-server")
    assert asked == 0
    assert raw.rstrip().endswith(b"}")  # the failure event, no [DONE]
    assert b"upstream_stream_error" in raw


def _finishes(raw: bytes) -> list[Any]:
    return [
        c.get("finish_reason")
        for line in raw.split(b"\n")
        if line.startswith(b"data: {")
        for c in json.loads(line[6:]).get("choices", [])
    ]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n_predict"])
async def test_a_chat_stream_cut_after_its_last_allowed_token_ends_for_length(field: str) -> None:
    # llama-server sends finish_reason "length" in a chunk of its own after the last token: a
    # cut between them left nothing to ask for, and the next region was asked for one more.
    payload = body(stream=True, **{field: 2})
    raw, asked = await post(
        breaks_after(delta("Hel"), delta("lo")), CHAT, payload, kind="llama-server"
    )
    assert asked == 0
    assert texts(raw) == ("Hello", [])
    assert _finishes(raw) == [None, None, "length"]
    assert raw.endswith(b"data: [DONE]\n\n")
    last = json.loads(raw.split(b"\n\n")[-3][6:])
    assert (last["id"], last["object"]) == ("chatcmpl-a", "chat.completion.chunk")


async def test_a_completions_stream_cut_after_its_last_allowed_token_ends_for_length() -> None:
    text = {"index": 0, "text": " is", "finish_reason": None}
    payload = {"model": "m", "prompt": "The sea", "stream": True, "max_tokens": 1}
    raw, asked = await post(
        breaks_after(event({"id": "cmpl-a", "choices": [text]})), COMPLETIONS, payload
    )
    assert asked == 0
    assert _finishes(raw) == [None, "length"]
    assert raw.endswith(b"data: [DONE]\n\n")


async def test_a_chat_stream_with_tokens_left_is_still_continued_for_what_is_left() -> None:
    payload = body(stream=True, max_tokens=3)
    raw, asked = await post(breaks_after(delta("Hel"), delta("lo")), CHAT, payload)
    assert (texts(raw), asked) == (("Hello more", []), 1)


async def test_a_messages_stream_cut_after_its_last_allowed_token_ends_for_max_tokens() -> None:
    start = ev("message_start", message={"id": "msg_1"})
    block = ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
    text = ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})
    payload = {
        "model": "m",
        "max_tokens": 1,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    raw, asked = await post(breaks_after(start, block, text), MESSAGES, payload, "llama-server")
    # Never asked for a token past max_tokens; it ends as the region ends one at the limit.
    assert asked == 0
    assert [e["type"] for e in events_of(raw)][-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    said = events_of(raw)[-2]
    assert said["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert said["usage"] == {"output_tokens": 1}
    assert b"event: error" not in raw


async def test_a_responses_stream_cut_after_its_last_allowed_token_ends_incomplete() -> None:
    opened = {"id": "resp_1", "object": "response", "model": "m", "status": "in_progress"}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress"}
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    sent = [
        ev("response.created", response=opened, sequence_number=0),
        ev("response.output_item.added", output_index=0, item=item, sequence_number=1),
        ev("response.content_part.added", **where, part=part, sequence_number=2),
        ev("response.output_text.delta", **where, delta="Hi", sequence_number=3),
        ev("response.output_text.delta", **where, delta=" there", sequence_number=4),
    ]
    payload = {"model": "m", "input": "hi", "max_output_tokens": 2, "stream": True, "store": False}
    raw, asked = await post(breaks_after(*sent), RESPONSES, payload, "llama-server")
    assert asked == 0
    events = events_of(raw)
    assert [e["type"] for e in events][5:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e["sequence_number"] for e in events] == list(range(9))
    assert events[5]["text"] == events[6]["part"]["text"] == "Hi there"
    final = events[-1]["response"]
    assert (final["id"], final["status"]) == ("resp_1", "incomplete")
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"] == [
        {**item, "status": "completed", "content": [{**part, "text": "Hi there"}]}
    ]
    # No prompt count here (the first region reported none, no counter): no usage made up.
    assert "usage" not in final
