"""Mid-stream resume pieces: whole-event relay, prefill body, restamped continuation events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.routing.continuation import (
    StreamTracker,
    continuation_body,
    first_stream,
    restamp,
)
from router.routing.seam import FirstStream


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def delta(content: str, ident: str = "chatcmpl-1") -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
    return ev({"id": ident, "created": 5, "model": "m", "choices": [choice]})


def test_tracker_passes_whole_events_only_and_collects_text() -> None:
    t = StreamTracker()
    stream = delta("Hel") + delta("lo") + b"data: [DONE]\n\n"
    cut = len(delta("Hel")) + 7  # inside the second event
    assert t.feed(stream[:cut]) == delta("Hel")
    assert t.text == ""  # read only once the caller has sent what feed() passed on
    t.settle()
    assert t.text == "Hel"
    assert t.tail == stream[len(delta("Hel")) : cut]
    assert t.feed(stream[cut:]) == stream[len(delta("Hel")) :]
    t.settle()
    assert (t.text, t.events, t.done) == ("Hello", 2, True)
    assert t.ident == {"id": "chatcmpl-1", "created": 5, "model": "m"}
    assert t.flush() == b""


def test_tracker_ignores_role_usage_and_garbage_events() -> None:
    t = StreamTracker()
    role = ev({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    usage = ev({"id": "x", "choices": [], "usage": {"total_tokens": 3}})
    out = t.feed(role + b": keep-alive comment\n\n" + b"data: {not json\n\n" + usage)
    assert out.endswith(usage)
    t.settle()
    assert (t.text, t.events, t.done) == ("", 0, False)
    t.feed(b"data: [DO")
    assert t.flush() == b"data: [DO"


def test_continuation_body_appends_prefill_and_shrinks_limits() -> None:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    ).encode()
    made = continuation_body(body, "Hello wor", 3)
    assert made is not None
    assert made[1] == "Hello wor"
    out = json.loads(made[0])
    assert out["messages"][-1] == {"role": "assistant", "content": "Hello wor"}
    assert out["messages"][0] == {"role": "user", "content": "hi"}
    assert out["max_tokens"] == 7
    assert out["continue_final_message"] is True
    assert out["add_generation_prompt"] is False
    capped = continuation_body(body.replace(b"10", b"2"), "x", 9)
    assert capped is not None
    assert json.loads(capped[0])["max_tokens"] == 1


def test_a_chat_clients_own_prefill_is_extended() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well, "}]
    body = json.dumps({"model": "m", "messages": messages}).encode()
    for sent, echoed in (("hel", False), ("Well, hel", True)):
        made = continuation_body(body, sent, 1, "llama-server", FirstStream(True, echoed))
        assert made is not None
        out = json.loads(made[0])
        assert out["messages"] == [messages[0], {"role": "assistant", "content": "Well, hel"}]
        assert made[1] == "Well, hel"
    calls = [*messages[:1], {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]
    called = json.dumps({"model": "m", "messages": calls}).encode()
    assert continuation_body(called, "x", 1, "vllm", FirstStream(extends=True)) is None


@pytest.mark.parametrize(
    ("kind", "endpoint", "fields", "extends", "echoed"),
    [
        ("llama-server", "/v1/chat/completions", {}, True, True),
        ("llama-server", "/v1/responses", {}, True, True),
        ("sim", "/v1/responses", {}, True, True),
        ("vllm", "/v1/chat/completions", {}, False, False),
        ("vllm", "/v1/chat/completions", {"continue_final_message": True}, True, False),
        ("openai", "/v1/chat/completions", {}, False, False),
        ("llama-cpp-python", "/v1/chat/completions", {}, False, False),
        ("vllm", "/v1/responses", {}, False, False),
        ("vllm", "/v1/messages", {}, True, True),
        ("generic", "/v1/messages", {}, True, True),
    ],
)
def test_how_each_kind_treats_a_trailing_assistant_message(
    kind: str, endpoint: str, fields: dict[str, Any], extends: bool, echoed: bool
) -> None:
    body = json.dumps({"model": "m", **fields}).encode()
    found = first_stream(kind, endpoint, body)
    assert (found.extends, found.echoed) == (extends, echoed)
    # llama-server (and the sim, standing for it) reads n_predict before the API's fields.
    assert found.n_predict == (kind in ("llama-server", "sim"))


def test_restamp_drops_the_role_preamble_and_keeps_the_first_identity() -> None:
    ident = {"id": "chatcmpl-first", "created": 1, "model": "m"}
    role = {
        "id": "other",
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        ],
    }
    assert restamp(ev(role).rstrip(b"\n"), ident) is None
    stamped = restamp(delta("lo", ident="other").rstrip(b"\n"), ident)
    assert stamped is not None
    obj = json.loads(stamped[6:])
    assert obj["id"] == "chatcmpl-first"
    assert obj["choices"][0]["delta"]["content"] == "lo"
    assert restamp(b"data: [DONE]", ident) == b"data: [DONE]"


def test_a_continuations_usage_covers_the_whole_answer() -> None:
    from router.routing.continuation import whole_usage

    usage = {"prompt_tokens": 65, "completion_tokens": 20, "total_tokens": 85}
    fixed = whole_usage(ev({"id": "x", "choices": [], "usage": usage}), sent=40)
    assert json.loads(fixed[6:])["usage"] == {
        "prompt_tokens": 25,
        "completion_tokens": 60,
        "total_tokens": 85,
    }
    plain = delta("no usage here")
    assert whole_usage(plain, sent=40) == plain
    # Events are not tokens: the prefill re-tokenised need not be `sent` tokens long, so the
    # request's own prompt count (the first region's report, else the router's) is used.
    usage = {"prompt_tokens": 49, "completion_tokens": 20, "total_tokens": 69}
    fixed = whole_usage(ev({"id": "x", "choices": [], "usage": usage}), sent=40, prompt=7)
    assert json.loads(fixed[6:])["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 60,
        "total_tokens": 67,
    }


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.mark.parametrize(
    ("fields", "n_predict", "expected"),
    [
        # llama-server reads n_predict first: 100 allowed, 40 sent, 60 left, in every field.
        ({"n_predict": 100}, True, {"n_predict": 60}),
        ({"max_tokens": 500, "n_predict": 100}, True, {"max_tokens": 60, "n_predict": 60}),
        (
            {"max_completion_tokens": 80, "max_tokens": 500},
            True,
            {"max_completion_tokens": 40, "max_tokens": 40},
        ),
        # A negative n_predict is no bound there: nothing is lowered.
        ({"max_tokens": 500, "n_predict": -1}, True, {"max_tokens": 500, "n_predict": -1}),
        # A region that never reads n_predict stopped at max_tokens: so does the next.
        ({"max_tokens": 100, "n_predict": -1}, False, {"max_tokens": 60, "n_predict": 60}),
        ({"n_predict": 100}, False, {"n_predict": 100}),
        ({}, True, {}),
        ({"max_tokens": 30}, True, {"max_tokens": 1}),
    ],
)
def test_a_continuation_is_allowed_what_the_first_region_read_less_what_was_sent(
    fields: dict[str, Any], n_predict: bool, expected: dict[str, Any]
) -> None:
    from router.routing.continuation import completion_body

    first = FirstStream(n_predict=n_predict)
    made = continuation_body(_body(**fields).encode(), "x", 40, "llama-server", first)
    assert made is not None
    out = json.loads(made[0])
    assert {k: out[k] for k in fields} == expected
    if "max_completion_tokens" in fields:
        return  # a chat field
    prompt = json.dumps({"model": "m", "prompt": "The sea", **fields}).encode()
    out = json.loads(completion_body(prompt, " is", 40, first))
    assert {k: out[k] for k in fields} == expected
    assert out["prompt"] == "The sea is"


def test_continuation_modes_follow_the_server_kind() -> None:
    import msgspec

    from router.config import RegionConfig
    from router.routing.continuation import deterministic, mode_of

    def region(**extra: str) -> RegionConfig:
        return msgspec.convert(
            {"name": "a", "base_url": "http://a", "models": ["m"], **extra}, RegionConfig
        )

    assert mode_of(region(kind="vllm")) == mode_of(region(kind="llama-server")) == "continue"
    assert mode_of(region(kind="llama-cpp-python")) == mode_of(region()) == "regenerate"
    assert mode_of(region(kind="vllm", continuation="none")) == "none"
    assert deterministic(b'{"temperature": 0}')
    assert deterministic(b'{"seed": 7, "temperature": 1}')
    assert not deterministic(b'{"temperature": 0.2}')
    # llama.cpp's server samples at temperature 0 with a dynamic temperature range.
    assert not deterministic(b'{"temperature": 0, "dynatemp_range": 0.5}')
    assert deterministic(b'{"temperature": 0, "dynatemp_range": 0.5, "seed": 1}')
    assert deterministic(b'{"temperature": 0, "dynatemp_range": 0}')
    assert not deterministic(b"{}")
    # ... and with a sampler chain that leaves the temperature sampler out.
    assert not deterministic(b'{"temperature": 0, "samplers": "kpx"}')
    assert not deterministic(b'{"temperature": 0, "samplers": ["top_k", "min_p"]}')
    assert deterministic(b'{"temperature": 0, "samplers": ["top_k", "temperature"]}')
    assert deterministic(b'{"temperature": 0, "samplers": "kt"}')
    assert deterministic(b'{"temperature": 0, "samplers": "kpx", "seed": 1}')
    # ... and with XTC on before the temperature sampler (it draws whether to drop the top).
    assert not deterministic(b'{"temperature": 0, "xtc_probability": 0.3}')
    assert not deterministic(b'{"temperature": 0, "xtc_probability": 0.3, "xtc_threshold": 0.2}')
    assert deterministic(b'{"temperature": 0, "xtc_probability": 0.3, "xtc_threshold": 0.7}')
    assert deterministic(b'{"temperature": 0, "xtc_probability": 0.3, "samplers": "ktx"}')
    assert deterministic(b'{"temperature": 0, "xtc_probability": 0.3, "seed": 1}')


def test_a_prefill_with_parts_of_any_type_is_not_text() -> None:
    from router.routing.seam import _text_of

    assert _text_of([{"type": []}, {"type": "text", "text": "a"}]) is None
    assert _text_of([{"type": {"a": 1}}]) is None
    assert _text_of([{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]) == "ab"


def _stitched(stitch: Any, events: list[bytes]) -> list[Any]:
    out = b"".join(filter(None, (stitch.event(e) for e in events)))
    return [
        json.loads(line[6:]) if line != b"data: [DONE]" else "[DONE]"
        for line in out.split(b"\n")
        if line.startswith(b"data: ")
    ]


def test_a_continuation_without_usage_gets_the_usage_chunk_the_client_asked_for() -> None:
    """llama-cpp-python sends no usage event: the client that asked for one still gets the
    usage of the whole answer, before [DONE], with the first stream's identity."""
    from router.routing.continuation import ChatStitch

    tracker = StreamTracker()
    tracker.feed(delta("Hel", ident="chatcmpl-first") + delta("lo"))
    tracker.settle()
    finish = {"index": 0, "delta": {}, "finish_reason": "stop"}
    rest = [delta("Hello", ident="b"), delta(" there", ident="b"), delta("!", ident="b")]
    rest += [ev({"id": "b", "choices": [finish]}), b"data: [DONE]\n\n"]
    # Regenerated: it repeats "Hello" (held back), then 2 new chunks: 4 in all.
    got = _stitched(ChatStitch(tracker, prefill=None, prompt=7, usage=True), rest)
    assert got[-1] == "[DONE]"
    assert got[-2]["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert got[-2]["id"] == "chatcmpl-first"
    assert got[-2]["choices"] == []
    assert got[-2]["object"] == "chat.completion.chunk"
    # Not asked for: none made; reported by the region: not made twice.
    got = _stitched(ChatStitch(tracker, prefill=None, prompt=7), rest)
    assert not [e for e in got if e != "[DONE]" and "usage" in e]
    usage = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    reported = [*rest[:-1], ev({"id": "b", "choices": [], "usage": usage}), rest[-1]]
    got = _stitched(ChatStitch(tracker, prefill=None, prompt=7, usage=True), reported)
    assert [e["usage"] for e in got if e != "[DONE]" and "usage" in e] == [usage]


def test_a_stream_cut_at_its_limit_ends_as_the_region_would() -> None:
    from router.routing.continuation import length_end

    tracker = StreamTracker()
    tracker.feed(delta("Hel") + delta("lo"))
    tracker.settle()
    chunks = [json.loads(p[6:]) for p in length_end(tracker, True, 9).split(b"\n\n")[:2]]
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]
    assert chunks[1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    assert {c["id"] for c in chunks} == {"chatcmpl-1"}
    assert length_end(tracker, True, None).endswith(b"}\n\ndata: [DONE]\n\n")
    assert length_end(tracker, True, None).count(b"data: ") == 2  # no prompt count: no usage


def test_a_length_field_that_cannot_be_read_stops_the_continuation() -> None:
    from router.routing.continuation import completion_body
    from router.routing.seam import lower_limits

    llama = FirstStream(n_predict=True)
    for value in (7.5, "x", True):
        raw = _body(n_predict=value).encode()
        assert not lower_limits(json.loads(raw), raw, "/v1/chat/completions", llama, 3)
        assert continuation_body(raw, "x", 3, "llama-server", llama) is None
        prompt = json.dumps({"model": "m", "prompt": "a", "n_predict": value}).encode()
        assert completion_body(prompt, "b", 3, llama) is None
    # A region that never reads n_predict is not held back by it (it gets the lowered bound).
    made = continuation_body(_body(n_predict=7.5, max_tokens=9).encode(), "x", 3, "vllm")
    assert made is not None
    assert json.loads(made[0])["n_predict"] == 6


def test_a_tracker_notes_a_chunk_a_prefill_cannot_carry() -> None:
    tracker = StreamTracker()
    call = {"index": 0, "delta": {"tool_calls": [{"index": 0}]}, "finish_reason": None}
    tracker.feed(delta("Hi") + ev({"id": "c", "choices": [call]}))
    tracker.settle()
    assert tracker.unsupported
    text_only = StreamTracker(completions=True)
    text_only.feed(ev({"id": "c", "choices": [{"index": 0, "text": "a", "tool_calls": [1]}]}))
    text_only.settle()
    assert not text_only.unsupported  # completions have no such fields


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def _seam_stitch(had: list[str], body: dict[str, Any], first: FirstStream) -> Any:
    """A ChatStitch continuing the text `had` (the client's chunks) under `body`'s stop."""
    from router.routing.continuation import ChatStitch
    from router.routing.seam import seam_stop

    tracker = StreamTracker()
    tracker.feed(b"".join(delta(piece, ident="chatcmpl-first") for piece in had))
    tracker.settle()
    seam = seam_stop(json.dumps(body).encode(), tracker.text, first)
    return ChatStitch(tracker, prefill=tracker.text, prompt=3, usage=True, seam=seam)


FINISHED = [ev({"id": "b", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})]


def _said(got: list[Any]) -> str:
    return "".join(c["delta"].get("content") or "" for e in got[:-1] for c in e["choices"])


def test_a_stop_string_completed_across_the_seam_ends_the_answer_there() -> None:
    """The client has "The sea is bl"; the stop "blue" completes in the continuation's "u" +
    "e": the answer ends with the client's text, finish_reason "stop", the usage, [DONE]."""
    stitch = _seam_stitch(["The", " sea", " is", " bl"], _chat(stop=["x", "blue"]), FirstStream())
    got = _stitched(stitch, [delta("u", "b"), delta("e and", "b"), delta(" more", "b")])
    assert stitch.ended
    assert _said(got) == ""
    assert got[0]["choices"][0]["finish_reason"] == "stop"
    assert got[0]["id"] == "chatcmpl-first"
    assert got[1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert got[2] == "[DONE]"


def test_text_held_at_the_seam_goes_on_once_it_cannot_complete_a_stop_string() -> None:
    stitch = _seam_stitch(["The", " sea", " is", " bl"], _chat(stop="blue"), FirstStream())
    got = _stitched(stitch, [delta("u", "b"), delta("r", "b"), delta("red", "b"), *FINISHED])
    assert not stitch.ended
    assert _said(got) == "urred"
    assert [len(e["choices"]) for e in got[:3]] == [1, 1, 1]  # each chunk as it came
    # The region ended while its text was held: that text was its last, sent before its end.
    stitch = _seam_stitch(["The", " bl"], _chat(stop="blue"), FirstStream())
    got = _stitched(stitch, [delta("u", "b"), *FINISHED, b"data: [DONE]\n\n"])
    assert _said(got) == "u"
    assert got[1]["choices"][0]["finish_reason"] == "stop"


def test_a_chunk_without_text_while_text_is_held_keeps_the_stop_string_checked() -> None:
    """An empty delta (or a comment) between the continuation's pieces is no end of its text:
    it waits with the held text, and the stop string completed after it still ends there."""
    for mid in (delta("", "b"), b": keep-alive\n\n"):
        stitch = _seam_stitch(["The", " bl"], _chat(stop="blue"), FirstStream())
        got = _stitched(stitch, [delta("u", "b"), mid, delta("e and more", "b")])
        assert stitch.ended, mid
        assert _said(got) == ""
        assert got[0]["choices"][0]["finish_reason"] == "stop"


def test_a_clients_own_prefill_answered_back_is_no_start_of_a_stop_string() -> None:
    """No server matches stop strings in the prompt: text the first region answered back (the
    client's prefill) does not begin one, text it generated does."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The bl"}]
    echoed = FirstStream(extends=True, echoed=True)
    stitch = _seam_stitch(["The bl"], _chat(messages=messages, stop="blue"), echoed)
    assert stitch.seam is None
    stitch = _seam_stitch(["The bl", "ue bl"], _chat(messages=messages, stop="blue"), echoed)
    assert stitch.seam is not None  # " bl" is its own
