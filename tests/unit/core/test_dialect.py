"""core.dialect and core.stream's EventState: the Responses and Messages stream grammars."""

from __future__ import annotations

import json

import msgspec
import pytest

from router.core.dialect import (
    CHAT_API,
    MESSAGES_API,
    RESPONSES_API,
    dialect_of,
    response_id,
    stored_ids,
)
from router.core.request import MAX_ITEM_REFERENCES, MESSAGES, RESPONSES, ParsedRequest, parse_body
from router.core.responses import anthropic_relayed
from router.core.stream import MAX_NOTED_ITEMS, EventState, passable
from router.errors import InvalidRequest, NotFound, anthropic_error_body
from router.net import sse


def _ev(name: str, **data: object) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


CREATED = _ev("response.created", response={"id": "resp_1", "status": "in_progress"})
ADDED = _ev("response.output_item.added", item={"type": "message", "role": "assistant"})
DELTA = _ev("response.output_text.delta", delta="Hi", sequence_number=4)
COMPLETED = _ev("response.completed", response={"id": "resp_1", "status": "completed"})


def test_preamble_events_are_not_a_first_token() -> None:
    token = RESPONSES_API.has_token
    assert token is not None
    assert not token(CREATED)
    assert not token(ADDED)
    assert token(DELTA)
    # Comments and fields without data are no token either.
    for filler in (b": keep-alive\n\n", b"retry: 10\n\n", b"event: x\n\n", b"data:\n\n"):
        assert not token(filler)
    messages = MESSAGES_API.has_token
    assert messages is not None
    assert not messages(_ev("message_start", message={"id": "m"}))
    assert not messages(_ev("ping"))
    assert messages(_ev("content_block_delta", delta={"text": "x"}))
    assert messages(_ev("error", error={"type": "overloaded_error"}))  # relayed: its own end
    assert CHAT_API.has_token is None  # OpenAI chunks: core.attempt.has_token


def test_event_state_is_complete_only_after_a_terminal_event() -> None:
    state = RESPONSES_API.tracker()
    assert isinstance(state, EventState)
    events = sse.split_events(CREATED + DELTA)
    out = passable([e + b"\n\n" for e in events], state, False)
    assert out == CREATED + DELTA
    assert not state.complete
    assert state.cut_reason == "stream ended before its terminal event"
    assert state.response_id == "resp_1"
    assert state.sequence == 4
    passable([b"data: {not json\n\n"], state, False)
    assert state.invalid == 1
    passable([COMPLETED], state, False)
    assert state.complete
    assert not state.owes_done  # no [DONE] is added to these streams


def test_responses_failure_event_names_the_stream_and_follows_its_numbering() -> None:
    state = RESPONSES_API.tracker()
    for event in (CREATED, DELTA):
        passable([event], state, False)
    raw = RESPONSES_API.stream_failure("The region stopped mid-stream (reset).", state)
    assert raw.startswith(b"event: response.failed\ndata: ")
    assert raw.endswith(b"\n\n")
    data = json.loads(sse.data_of(raw.rstrip(b"\n")) or b"")
    assert data["type"] == "response.failed"
    assert data["sequence_number"] == 5
    assert data["response"]["id"] == "resp_1"
    assert data["response"]["status"] == "failed"
    assert data["response"]["error"]["message"] == "The region stopped mid-stream (reset)."


def test_messages_failure_is_an_anthropic_error_event() -> None:
    raw = MESSAGES_API.stream_failure("cut", MESSAGES_API.tracker())
    assert raw.startswith(b"event: error\n")
    data = json.loads(sse.data_of(raw.rstrip(b"\n")) or b"")
    assert data == {"type": "error", "error": {"type": "api_error", "message": "cut"}}
    chat = CHAT_API.stream_failure("cut", CHAT_API.tracker())
    assert json.loads(sse.data_of(chat.rstrip(b"\n")) or b"")["error"]["message"] == "cut"


def test_dialects_by_path() -> None:
    assert dialect_of(RESPONSES) is RESPONSES_API
    assert dialect_of(MESSAGES) is MESSAGES_API
    assert dialect_of("/v1/unknown") is CHAT_API
    assert MESSAGES_API.anthropic
    assert not RESPONSES_API.anthropic


def test_response_id_of_a_whole_answer() -> None:
    assert response_id(b'{"id": "resp_9", "object": "response", "output": []}') == "resp_9"
    assert response_id(b'{"id": "chatcmpl-1", "object": "chat.completion"}') is None
    assert response_id(b"not json") is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (422, "invalid_request_error"),
    ],
)
def test_anthropic_error_types_by_status(status: int, kind: str) -> None:
    body = json.loads(anthropic_error_body(status, "m"))
    assert body == {"type": "error", "error": {"type": kind, "message": "m"}}


def test_relayed_openai_errors_become_anthropic_errors() -> None:
    openai_shaped = b'{"error": {"message": "bad thing", "type": "invalid_request_error"}}'
    assert json.loads(anthropic_relayed(400, openai_shaped)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad thing"},
    }
    native = b'{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}'
    assert anthropic_relayed(529, native) == native
    assert anthropic_relayed(500, b"<html>oops</html>") == b"<html>oops</html>"
    assert NotFound("x").anthropic_body() == anthropic_error_body(404, "x")


def _parse(endpoint: str, body: dict[str, object]) -> object:
    return parse_body(endpoint, msgspec.json.encode(body))


def test_responses_requests_that_hold_state_are_marked() -> None:
    stored = parse_body(RESPONSES, b'{"model": "m", "input": "hi"}')
    assert stored.stateful  # store defaults to true
    assert not stored.stream
    plain = parse_body(RESPONSES, b'{"model": "m", "input": "hi", "store": false}')
    assert not plain.stateful
    chained = parse_body(
        RESPONSES, b'{"model": "m", "input": "x", "store": false, "previous_response_id": "r1"}'
    )
    assert chained.stateful
    assert chained.state_ref == "r1"
    background = parse_body(
        RESPONSES, b'{"model": "m", "input": "x", "store": false, "background": true}'
    )
    assert background.stateful
    # A prompt template the provider keeps (it may change under its id); no input needed.
    templated = parse_body(
        RESPONSES,
        b'{"model": "m", "store": false, "prompt": {"id": "pmpt_1", "variables": {"a": "b"}}}',
    )
    assert templated.stateful
    streamed = parse_body(RESPONSES, b'{"model": "m", "input": [], "store": false, "stream": true}')
    assert streamed.stream
    assert streamed.include_usage  # reported by the stream itself: nothing to ask for


def test_item_references_make_a_responses_request_stateful() -> None:
    """An input item referring to one a region stored (`item_reference`, its type optional,
    at any position) is state only that region has, as previous_response_id is."""
    message = {"role": "user", "content": "and now?"}
    for ref in (
        {"type": "item_reference", "id": "msg_1"},
        {"id": "msg_1"},
        {"type": None, "id": "msg_1"},
    ):
        for at in (0, 1):
            given: list[object] = [message, message]
            given.insert(at, ref)
            asked = _parse(RESPONSES, {"model": "m", "input": given, "store": False})
            assert isinstance(asked, ParsedRequest)
            assert asked.stateful
            assert asked.state_items == ("msg_1",)
    # Distinct ids, in order, every one of them (each is checked for its tenant: none may be
    # left unchecked past a cap), at most MAX_ITEM_REFERENCES, else a 400; one without an id
    # still counts.
    many = [{"type": "item_reference", "id": f"i{n % 40}"} for n in range(80)]
    asked = _parse(RESPONSES, {"model": "m", "input": many, "store": False})
    assert isinstance(asked, ParsedRequest)
    assert asked.state_items == tuple(f"i{n}" for n in range(40))
    most = [{"type": "item_reference", "id": f"i{n}"} for n in range(MAX_ITEM_REFERENCES + 1)]
    assert len(_parse(RESPONSES, {"model": "m", "input": most[:-1]}).state_items) == 256  # type: ignore[attr-defined]
    with pytest.raises(InvalidRequest, match="more than 256 distinct stored items"):
        _parse(RESPONSES, {"model": "m", "input": most})
    odd = _parse(RESPONSES, {"model": "m", "input": [{"type": "item_reference"}], "store": False})
    assert isinstance(odd, ParsedRequest)
    assert odd.stateful
    assert odd.state_items == ()
    # Messages (typed or not), function outputs and prompt variables refer to nothing stored.
    plain = _parse(
        RESPONSES,
        {
            "model": "m",
            "store": False,
            "input": [
                message,
                {"type": "message", "id": "msg_2", "role": "assistant", "content": "x"},
                {"type": "function_call_output", "call_id": "c", "output": "{}"},
            ],
        },
    )
    assert isinstance(plain, ParsedRequest)
    assert not plain.stateful
    assert plain.state_items == ()


def test_what_a_response_leaves_stored_is_noted_whole_and_streamed() -> None:
    body = {
        "id": "resp_1",
        "object": "response",
        "output": [{"type": "reasoning", "id": "rs_1"}, {"type": "message", "id": "msg_1"}],
    }
    assert stored_ids(msgspec.json.encode(body)) == ["resp_1", "rs_1", "msg_1"]
    assert stored_ids(b'{"id": "chatcmpl-1", "object": "chat.completion"}') == []
    assert stored_ids(b"not json") == []
    state = EventState(RESPONSES_API.terminal)
    done = _ev("response.completed", response={**body, "status": "completed"})
    passable([CREATED, ADDED, DELTA], state, False)
    assert state.items == []
    passable([done], state, False)
    assert state.response_id == "resp_1"
    assert state.items == ["rs_1", "msg_1"]
    # An odd output item (an id that is no string, an item that is no object) is skipped; it
    # hides neither the response's id nor its stream's end.
    odd = {**body, "output": [{"id": 5}, "text", None, {"type": "message", "id": "msg_2"}]}
    assert stored_ids(msgspec.json.encode(odd)) == ["resp_1", "msg_2"]
    state = EventState(RESPONSES_API.terminal)
    passable([_ev("response.completed", response={**odd, "status": "completed"})], state, False)
    assert (state.ended, state.response_id, state.items) == (True, "resp_1", ["msg_2"])
    # At most MAX_NOTED_ITEMS items of one response are noted (each is a note, and a write).
    many = {**body, "output": [{"type": "message", "id": f"m{n}"} for n in range(300)]}
    noted = stored_ids(msgspec.json.encode(many))
    assert noted == ["resp_1", *(f"m{n}" for n in range(MAX_NOTED_ITEMS))]


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        (RESPONSES, {"model": "m"}, "input"),
        (RESPONSES, {"model": "m", "input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
        (RESPONSES, {"model": "m", "input": 5}, "input"),
        (MESSAGES, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (MESSAGES, {"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        (
            MESSAGES,
            {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            "messages.0.role",
        ),
        (
            MESSAGES,
            {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
        ),
        (
            MESSAGES,
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]},
            "messages[0].content",
        ),
    ],
)
def test_invalid_responses_and_messages_requests_name_the_parameter(
    endpoint: str, body: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        _parse(endpoint, body)
    assert refused.value.param == param


def test_a_second_copy_of_an_acted_on_field_is_refused() -> None:
    body = b'{"model": "m", "input": "x", "max_output_tokens": 5, "max_output_tokens": 50000}'
    with pytest.raises(InvalidRequest) as refused:
        parse_body(RESPONSES, body)
    assert refused.value.param == "max_output_tokens"


def test_a_missing_field_is_named_once() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_body(MESSAGES, b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}')
    assert refused.value.message == "Invalid request: `max_tokens` is required."
    with pytest.raises(InvalidRequest) as nested:
        parse_body(MESSAGES, b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user"}]}')
    assert nested.value.message == "Invalid request: `messages[0].content` is required."
