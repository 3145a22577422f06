"""Responses and Messages requests counted as the chat request they render to; their usage."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from router.access.auth import ANONYMOUS_TENANT
from router.access.limits import Limiter
from router.access.prompts import _anthropic_messages, chat_view
from router.access.usage import StreamUsage, reported_usage, usage_tokens
from router.core.request import CHAT, MESSAGES, RESPONSES, parse_body
from router.native import count_request_tokens


def _view(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    raw = msgspec.json.encode(body)
    parsed = parse_body(endpoint, raw)
    return json.loads(chat_view(parsed.decoded, endpoint == MESSAGES, raw))  # type: ignore[no-any-return]


def test_responses_input_as_chat_messages() -> None:
    view = _view(RESPONSES, {"model": "m", "input": "hi", "instructions": "be brief"})
    assert view["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    items = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
        {"type": "function_call", "name": "f", "arguments": '{"x": 1}', "call_id": "1"},
        {"type": "function_call_output", "call_id": "1", "output": "42"},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "d"},
                {"type": "input_image", "image_url": "data:,", "detail": "low"},
            ],
        },
    ]
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    view = _view(RESPONSES, {"model": "m", "input": items, "tools": tools})
    assert view["messages"] == [
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "c"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "content": "42"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "d"},
                {"type": "image_url", "image_url": {"detail": "low"}},
            ],
        },
    ]
    assert view["tools"] == tools


def test_messages_as_chat_messages() -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t", "name": "f", "input": {"x": 1}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "42"}],
            },
        ],
    }
    assert _view(MESSAGES, body)["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "calling"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x":1}'}}]},
        {"role": "tool", "content": "42"},
    ]


def test_the_same_prompt_counts_the_same_in_every_api() -> None:
    limiter = Limiter([ANONYMOUS_TENANT], default_max_tokens=100)
    text = "The quick brown fox jumps over the lazy dog " * 20
    chat = parse_body(
        CHAT,
        msgspec.json.encode(
            {
                "model": "gpt-4o",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": text},
                ],
                "max_tokens": 7,
            }
        ),
    )
    responses = parse_body(
        RESPONSES,
        msgspec.json.encode(
            {"model": "gpt-4o", "instructions": "sys", "input": text, "max_output_tokens": 7}
        ),
    )
    messages = parse_body(
        MESSAGES,
        msgspec.json.encode(
            {
                "model": "gpt-4o",
                "system": "sys",
                "max_tokens": 7,
                "messages": [{"role": "user", "content": text}],
            }
        ),
    )
    expected = limiter.estimate_parts(chat)
    assert expected[1] > 150
    assert expected[2] == 7
    assert limiter.estimate_parts(responses) == expected
    assert limiter.estimate_parts(messages) == expected
    # Counted as their text, not as the bytes of their JSON.
    assert expected[1] == count_request_tokens(chat.body, "o200k_base")


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def test_usage_in_every_shape() -> None:
    chat = _json({"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
    responses = _json(
        {"object": "response", "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}}
    )
    usage = {"input_tokens": 1, "cache_read_input_tokens": 2, "output_tokens": 4}
    anthropic = _json({"type": "message", "usage": usage})
    for body in (chat, responses, anthropic):
        assert usage_tokens(body) == 7
    completed = _json(
        {
            "type": "response.completed",
            "response": {"usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}},
        }
    )
    assert usage_tokens(completed) == 7
    used = reported_usage(anthropic)
    assert used is not None
    assert (used.prompt, used.completion) == (3, 4)
    assert reported_usage(b'{"usage": null}') is None


def _event(name: str, **data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


def test_an_anthropic_stream_reports_input_first_and_output_last() -> None:
    stream = (
        _event("message_start", message={"usage": {"input_tokens": 9, "output_tokens": 1}})
        + _event("content_block_delta", delta={"text": "x"})
        + _event("message_delta", usage={"output_tokens": 5})
        + _event("message_stop")
    )
    meter = StreamUsage(prompt_tokens=100)
    for i in range(0, len(stream), 7):
        meter.feed(stream[i : i + 7])
    assert meter.used() == 14


def test_content_parts_of_any_type_are_counted_never_a_crash() -> None:
    # A part's `type` may be anything a client sent (a list, an object): counted as its JSON.
    odd: list[Any] = [{"type": []}, {"type": {"a": 1}}, {"type": 5}]
    view = _view(RESPONSES, {"model": "m", "input": [{"role": "user", "content": odd}]})
    assert view["messages"][0]["content"] == odd
    view = _view(RESPONSES, {"model": "m", "input": "hi", "instructions": odd})
    assert view["messages"][0]["content"] == json.dumps(odd, separators=(",", ":"))
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": odd}]}
    assert _view(MESSAGES, body)["messages"][0]["content"] == odd


class _Block(dict[str, Any]):
    """A content block that counts how often it is compared with another."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _Block.compared += 1
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


def test_a_messages_content_is_split_by_type_without_comparing_blocks() -> None:
    # Comparing every block with every other made 16,000 tool results take seconds of the
    # event loop's time: the blocks are sorted by type in one pass instead.
    blocks: list[Any] = [
        _Block(type="tool_result", tool_use_id=f"t{i}", content=str(i)) for i in range(200)
    ]
    blocks += [_Block(type="text", text="and"), _Block(type="tool_use", name="f", input={})]

    message = SimpleNamespace(role="user", content=blocks)
    _Block.compared = 0
    messages = _anthropic_messages(SimpleNamespace(system=None, messages=[message]))
    assert _Block.compared == 0
    assert len(messages) == 202
    assert messages[200] == {"role": "user", "content": "and"}
    assert messages[201]["tool_calls"] == [{"function": {"name": "f", "arguments": "{}"}}]


def test_a_prompt_templates_variables_are_counted() -> None:
    # They are rendered into the template's messages; they counted nothing.
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 1000}
    variables = {"topic": "word " * 500, "pic": image, "note": {"type": "input_text", "text": "n"}}
    body = {"model": "m", "prompt": {"id": "pmpt_1", "variables": variables}, "input": "hi"}
    messages = _view(RESPONSES, body)["messages"]
    assert messages[0] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "word " * 500},
            # An image by the image rule, never by its bytes (as JSON text it was 100k tokens).
            {"type": "image_url", "image_url": {"detail": "auto"}},
            {"type": "text", "text": "n"},
        ],
    }
    assert messages[1] == {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("endpoint", "part"),
    [
        (RESPONSES, {"type": "input_file", "file_data": "A" * 300_000, "filename": "a.pdf"}),
        (MESSAGES, {"type": "document", "source": {"type": "base64", "data": "A" * 300_000}}),
    ],
)
def test_a_file_counts_as_a_file_part_not_its_bytes(endpoint: str, part: dict[str, Any]) -> None:
    # Counted as text, a 300 KB PDF was a 429 request_too_large; chat's file part was not.
    content = [part, {"type": "text" if endpoint == MESSAGES else "input_text", "text": "sum"}]
    body: dict[str, Any] = {"model": "m", "max_tokens": 5}
    if endpoint == MESSAGES:
        body["messages"] = [{"role": "user", "content": content}]
    else:
        body["input"] = [{"role": "user", "content": content}]
    raw = msgspec.json.encode(body)
    view = chat_view(parse_body(endpoint, raw).decoded, endpoint == MESSAGES, raw)
    assert count_request_tokens(view, "cl100k_base") < 2000


def test_a_text_document_counts_as_its_text() -> None:
    document = {"type": "document", "source": {"type": "text", "data": "word " * 1000}}
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [document]}]}
    text = {"type": "text", "text": "word " * 1000}
    assert _view(MESSAGES, body)["messages"] == [{"role": "user", "content": [text]}]
