"""routing.event_continuation: a Responses / Messages continuation stitched into the first
stream (ids, numbering, whole text and usage), and what is never continued."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.net import sse
from router.routing.event_continuation import EventTracker, Stitcher, continuation_body
from router.routing.seam import Diverged, FirstStream


def ev(name: str, **data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


def data(raw: bytes) -> dict[str, Any]:
    payload = sse.data_of(raw.rstrip(b"\n"))
    assert payload is not None
    return json.loads(payload)  # type: ignore[no-any-return]


def tracked(*events: bytes) -> EventTracker:
    tracker = EventTracker()
    tracker.feed(b"".join(events))
    tracker.settle()
    return tracker


FIRST = (
    ev("response.created", response={"id": "resp_1"}, sequence_number=0),
    ev("response.output_item.added", item={"type": "message", "id": "msg_1"}, sequence_number=1),
    ev("response.output_text.delta", item_id="msg_1", delta="Hel", sequence_number=2),
    ev("response.output_text.delta", item_id="msg_1", delta="lo", sequence_number=3),
)


def test_a_responses_continuation_becomes_the_first_stream() -> None:
    tracker = tracked(*FIRST)
    assert (tracker.text, tracker.events, tracker.response_id) == ("Hello", 2, "resp_1")
    stitcher = Stitcher(tracker, prefill=tracker.text)
    usage = {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}
    text_part = {"type": "output_text", "text": "Hello world"}
    item = {"type": "message", "id": "msg_2", "content": [text_part]}
    continuation = [
        ev("response.created", response={"id": "resp_2"}),
        ev("response.output_item.added", item={"type": "message", "id": "msg_2"}),
        ev("response.output_text.delta", item_id="msg_2", delta="Hello"),  # the echo
        ev("response.output_text.delta", item_id="msg_2", delta=" world"),
        ev("response.output_text.done", item_id="msg_2", text="Hello world"),
        ev("response.output_item.done", item=item),
        ev("response.completed", response={"id": "resp_2", "output": [item], "usage": usage}),
    ]
    out = []
    for event in continuation:
        stitched = stitcher.event(event)
        if stitched is not None:
            out.append(data(stitched))
            tracker.feed(stitched)
            tracker.settle()
    assert [e["type"] for e in out] == [
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert out[0]["delta"] == " world"
    assert out[0]["item_id"] == "msg_1"
    assert [e["sequence_number"] for e in out] == [4, 5, 6, 7]
    assert out[1]["text"] == "Hello world"
    final = out[-1]["response"]
    assert final["id"] == "resp_1"
    assert final["output"][0]["id"] == "msg_1"
    # The 2 tokens the client had were the continuation's prompt; they are the answer's.
    assert final["usage"] == {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    assert tracker.done
    # Events are not tokens: with the request's own input count (the first region's report,
    # else the router's), that is the input, not the continuation's less the events sent.
    counted = Stitcher(tracked(*FIRST), prefill="Hello", prompt=8)
    stitched = [counted.event(e) for e in continuation]
    last = stitched[-1]
    assert last is not None
    assert data(last)["response"]["usage"] == {
        "input_tokens": 8,
        "output_tokens": 5,
        "total_tokens": 13,
    }


def test_a_continuation_that_opens_a_tool_call_is_not_stitched() -> None:
    stitcher = Stitcher(tracked(*FIRST), prefill="Hello")
    call = ev("response.output_item.added", item={"type": "function_call", "id": "fc_1"})
    with pytest.raises(Diverged):
        stitcher.event(call)
    block = ev("content_block_start", index=0, content_block={"type": "tool_use"})
    with pytest.raises(Diverged):
        Stitcher(tracked(*FIRST), prefill="Hello").event(block)


def test_streams_that_left_the_text_are_never_continued() -> None:
    reasoning = ev("response.output_item.added", item={"type": "reasoning", "id": "rs_1"})
    assert tracked(FIRST[0], reasoning).unsupported
    tool = ev("content_block_start", index=1, content_block={"type": "tool_use"})
    assert tracked(ev("message_start", message={}), tool).unsupported
    thinking = ev("content_block_delta", index=0, delta={"type": "thinking_delta"})
    assert tracked(thinking).unsupported


def test_a_regenerated_answer_must_repeat_the_text_exactly() -> None:
    stitcher = Stitcher(tracked(*FIRST), prefill=None)
    with pytest.raises(Diverged):
        stitcher.event(ev("response.output_text.delta", item_id="m", delta="Help"))


def _continued(fields: dict[str, Any], sent: str, tokens: int, **options: Any) -> Any:
    made = continuation_body(json.dumps(fields).encode(), sent, tokens, **options)
    assert made is not None
    body, prefill = made
    return json.loads(body), prefill


def test_continuation_bodies() -> None:
    asked = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    messages, prefill = _continued(asked, "Hello", 2, anthropic=True)
    assert messages["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert (messages["max_tokens"], prefill) == (8, "Hello")
    asked = {"model": "m", "input": "x", "max_output_tokens": 1}
    responses, prefill = _continued(asked, "Hello", 2, anthropic=False)
    assert responses["input"] == [
        {"role": "user", "content": "x"},
        {"type": "message", "role": "assistant", "content": "Hello"},
    ]
    assert (responses["max_output_tokens"], prefill) == (1, "Hello")
    # llama-server reads n_predict first: every length field gets what it allowed, less sent.
    asked = {"model": "m", "input": "x", "max_output_tokens": 500, "n_predict": 10}
    made = continuation_body(
        json.dumps(asked).encode(), "Hello", 2, False, FirstStream(n_predict=True)
    )
    assert made is not None
    lowered = json.loads(made[0])
    assert (lowered["max_output_tokens"], lowered["n_predict"]) == (8, 8)


@pytest.mark.parametrize("anthropic", [True, False])
def test_a_clients_own_prefill_is_extended_not_followed_by_a_second_turn(
    anthropic: bool,
) -> None:
    key = "messages" if anthropic else "input"
    user = {"role": "user", "content": "Say hi"}
    parts = [{"type": "text" if anthropic else "output_text", "text": "Well, "}]
    asked = {"model": "m", "max_tokens": 10, key: [user, {"role": "assistant", "content": parts}]}
    continued, echoing = FirstStream(extends=True), FirstStream(extends=True, echoed=True)
    # The region did not answer the prefill back: the client has only the new text.
    body, prefill = _continued(asked, "hel", 1, anthropic=anthropic, first=continued)
    assert body[key] == [user, {"role": "assistant", "content": "Well, hel"}]
    assert prefill == "Well, hel"
    # It did (llama-server): the client's text already begins with it.
    body, prefill = _continued(asked, "Well, hel", 1, anthropic=anthropic, first=echoing)
    assert body[key][-1]["content"] == prefill == "Well, hel"
    # An echo is only believed when the text really begins with the prefill.
    _, prefill = _continued(asked, "Oh, hel", 1, anthropic=anthropic, first=echoing)
    assert prefill == "Well, Oh, hel"
    # Cut inside the echo: the client lacks part of the prefill; not carried on.
    assert continuation_body(json.dumps(asked).encode(), "Wel", 1, anthropic, echoing) is None
    # A region that answered the prefill with a turn of its own: the text is a turn of its own.
    body, prefill = _continued(asked, "hel", 1, anthropic=anthropic)
    assert body[key][-2:] == [
        {"role": "assistant", "content": parts},
        {**({} if anthropic else {"type": "message"}), "role": "assistant", "content": "hel"},
    ]
    assert prefill == "hel"
    # A prefill holding anything but text cannot be extended.
    tool = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    asked[key] = [user, {"role": "assistant", "content": [tool]}]
    assert continuation_body(json.dumps(asked).encode(), "x", 1, anthropic, continued) is None


def test_the_echo_of_a_whole_prefill_is_held_back() -> None:
    """The continuation answers the client's prefill and the text so far back first (the
    client had only the text): only what follows reaches the client."""
    tracker = tracked(*FIRST)
    stitcher = Stitcher(tracker, prefill="Well, Hello")
    out = [
        stitcher.event(ev("response.output_text.delta", item_id="m", delta=piece))
        for piece in ("Well, ", "Hel", "lo", " world")
    ]
    assert out[:3] == [None, None, None]
    assert out[3] is not None
    assert data(out[3])["delta"] == " world"
    done = stitcher.event(ev("response.output_text.done", item_id="m", text="ignored"))
    assert done is not None
    assert data(done)["text"] == "Hello world"


def test_events_of_another_shape_are_passed_over() -> None:
    # A region's `type` that is not a string (a list, an object) is noted as no known event.
    tracker = tracked(*FIRST, b'data: {"type": []}\n\n', b'data: {"type": {"a": 1}}\n\n')
    assert (tracker.text, tracker.response_id, tracker.unsupported) == ("Hello", "resp_1", False)


def _text(piece: str) -> bytes:
    return ev("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})


def _message_stitcher(stop: str) -> Stitcher:
    from router.routing.seam import seam_stop

    start = ev("message_start", message={"id": "msg_1"})
    block = ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
    tracker = tracked(start, block, _text("The sea"), _text(" is bl"))
    asked = {"messages": [{"role": "user", "content": "hi"}], "stop_sequences": [stop]}
    seam = seam_stop(json.dumps(asked).encode(), tracker.text, FirstStream())
    return Stitcher(tracker, prefill=tracker.text, seam=seam)


def test_a_stop_sequence_completed_across_the_seam_ends_the_message_there() -> None:
    stitcher = _message_stitcher("blue")
    assert stitcher.event(_text("u")) is None  # may complete "blue": held back
    end = stitcher.event(_text("e sky"))
    assert end is not None
    assert stitcher.ended
    events = [data(e + b"\n\n") for e in end.split(b"\n\n") if e]
    assert [e["type"] for e in events] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "blue"}
    assert events[1]["usage"] == {"output_tokens": 2}  # the client's two text deltas
    assert stitcher.event(_text(" more")) is None


def test_text_held_for_a_stop_sequence_goes_on_once_it_cannot_complete_it() -> None:
    stitcher = _message_stitcher("blue")
    assert stitcher.event(_text("u")) is None
    out = stitcher.event(_text("rry"))
    assert out is not None
    assert not stitcher.ended
    assert [data(e + b"\n\n")["delta"]["text"] for e in out.split(b"\n\n") if e] == ["u", "rry"]
    # The region's end while text is held: that text was its last, sent before the end.
    stitcher = _message_stitcher("blue")
    assert stitcher.event(_text("u")) is None
    out = stitcher.event(ev("content_block_stop", index=0))
    assert out is not None
    assert [data(e + b"\n\n")["type"] for e in out.split(b"\n\n") if e] == [
        "content_block_delta",
        "content_block_stop",
    ]
