"""Request validation (pure): decode, types, model lookup, alias rewrite, content type."""

from __future__ import annotations

import json

import msgspec
import pytest

from router.core.request import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    EMBEDDINGS,
    INPUT_TOKENS,
    MAX_MODEL_CHARS,
    MESSAGES,
    RESPONSES,
    UnsupportedMediaType,
    check_content_type,
    nesting,
    parse_body,
)
from router.errors import InvalidRequest

CHAT_BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_chat_parses_and_keeps_bytes() -> None:
    raw = body({**CHAT_BODY, "temperature": 0, "extra": {"x": 1}})
    parsed = parse_body(CHAT, raw)
    assert parsed.model == "m1"
    assert parsed.body is raw
    assert not parsed.stream
    assert not parsed.include_usage


def test_stream_and_include_usage() -> None:
    parsed = parse_body(
        CHAT, body({**CHAT_BODY, "stream": True, "stream_options": {"include_usage": True}})
    )
    assert parsed.stream
    assert parsed.include_usage
    # include_usage without stream is meaningless and ignored.
    parsed = parse_body(CHAT, body({**CHAT_BODY, "stream_options": {"include_usage": True}}))
    assert not parsed.include_usage


def test_content_parts_and_null_content_are_valid() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    assert parse_body(CHAT, body({"model": "m1", "messages": messages})).model == "m1"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"", None),
        (b"{", None),
        (b"[]", None),
        (b'{"messages": [{"role": "user"}]}', "model"),
        (b'{"model": "m1"}', "messages"),
        (b'{"model": 3, "messages": []}', "model"),
        (b'{"model": "", "messages": [{"role": "user"}]}', "model"),
        (b'{"model": "m1", "messages": {}}', "messages"),
        (b'{"model": "m1", "messages": []}', "messages"),
        (b'{"model": "m1", "messages": [{"content": "x"}]}', "messages[0].role"),
        (b'{"model": "m1", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"model": "m1", "messages": [{"role": "user"}], "stream": 1}', "stream"),
        (b'{"model": "m1", "messages": [{"role": "user", "content": "\xc3\x28"}]}', None),
    ],
)
def test_chat_rejections_name_the_parameter(raw: bytes, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_body(CHAT, raw)
    assert info.value.status == 400
    assert info.value.param == param
    shaped = msgspec.json.decode(info.value.body())
    assert shaped["error"]["type"] == "invalid_request_error"


def test_invalid_utf8_says_so() -> None:
    with pytest.raises(InvalidRequest, match="UTF-8"):
        parse_body(CHAT, b'{"model": "\xff", "messages": []}')


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_completion_prompts(prompt: object) -> None:
    assert parse_body(COMPLETIONS, body({"model": "m1", "prompt": prompt})).model == "m1"


@pytest.mark.parametrize("prompt", [5, [], [1, "a"], [[1], "a"], [[]], [True], [1.5]])
def test_bad_completion_prompts(prompt: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_body(COMPLETIONS, body({"model": "m1", "prompt": prompt}))
    assert info.value.param == "prompt"


def test_embeddings_input() -> None:
    assert parse_body(EMBEDDINGS, body({"model": "e", "input": ["a"]})).model == "e"
    with pytest.raises(InvalidRequest) as info:
        parse_body(EMBEDDINGS, body({"model": "e"}))
    assert info.value.param == "input"


def test_plain_model_keeps_the_exact_bytes() -> None:
    raw = body(CHAT_BODY)
    resolved = parse_body(CHAT, raw).with_model("m1")
    assert resolved.body is raw
    assert resolved.upstream_model == "m1"


def test_alias_rewrites_only_the_model() -> None:
    raw = b'{"model":"alias","messages":[{"role":"user","content":"hi"}],"x":{"y":[1.50,2]}}'
    resolved = parse_body(CHAT, raw).with_model("m1")
    assert resolved.model == "alias"
    assert resolved.upstream_model == "m1"
    assert resolved.body == raw.replace(b'"alias"', b'"m1"')


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.api+json",
    ],
)
def test_json_content_types_pass(value: str | None) -> None:
    check_content_type(value)


@pytest.mark.parametrize(
    "value", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_other_content_types_are_415(value: str) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        check_content_type(value)
    assert info.value.status == 415


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":1e999}',
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"metadata":'
        + b"[" * 5000
        + b"]" * 5000
        + b"}",
        b'{"model":"m","messages":[{"role":"user","content":['
        + b'{"a":' * 3000
        + b"1"
        + b"}" * 3000
        + b"]}]}",
    ],
    ids=["huge number", "deep metadata", "deep content part"],
)
def test_bodies_that_used_to_500_are_400(body: bytes) -> None:
    # Issue 24 item 11: a traceback and a 5xx in the SLO for a malformed body.
    with pytest.raises(InvalidRequest) as caught:
        parse_body(CHAT, body)
    assert caught.value.status == 400


def test_a_second_copy_of_a_field_the_router_acts_on_is_refused() -> None:
    # Issue 24 item 16: the router acted on the last value, a region may take the first.
    body = b'{"model":"a","messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_tokens":9}'
    with pytest.raises(InvalidRequest, match="more than once") as caught:
        parse_body(CHAT, body)
    assert caught.value.param == "max_tokens"
    # The same names deeper down, or inside text, are nobody's business but the region's.
    nested = (
        b'{"model":"a","messages":[{"role":"user","content":"\\"model\\": 1, \\"model\\": 2"}],'
        b'"tools":[{"type":"function","function":{"name":"model","parameters":'
        b'{"properties":{"model":{},"n":{}}}}}],"n":1}'
    )
    assert parse_body(CHAT, nested).model == "a"


def test_a_field_the_cache_reads_next_to_a_huge_number_is_no_duplicate() -> None:
    # A second `"metadata":` anywhere sends the body to the exact check (json.loads), whose
    # int() refuses past 4,300 digits what msgspec took: that is no reason to refuse it.
    schema = b'{"type":"object","properties":{"metadata":{"maximum":' + b"9" * 4400 + b"}}}"
    body = (
        b'{"model":"a","messages":[{"role":"user","content":"x"}],"metadata":{"k":"v"},'
        b'"tools":[{"type":"function","function":{"name":"f","parameters":' + schema + b"}}]}"
    )
    assert parse_body(CHAT, body).model == "a"


@pytest.mark.parametrize(
    ("name", "value"),
    [("service_tier", b'"flex"'), ("web_search_options", b"{}"), ("samplers", b'["temp"]')],
)
def test_a_second_copy_of_a_field_the_cache_reads_is_refused(name: str, value: bytes) -> None:
    # The cache reads the last copy (whether to store, what shapes the key); a region that
    # reads the first would answer another request than the one the entry is keyed by.
    field = f'"{name}":'.encode() + value
    body = b'{"model":"a","messages":[{"role":"user","content":"x"}],' + field + b"," + field + b"}"
    with pytest.raises(InvalidRequest, match="more than once") as caught:
        parse_body(CHAT, body)
    assert caught.value.param == name


@pytest.mark.parametrize(
    ("spelled", "param"),
    [(b'"max_tok\\u0065ns"', "max_tokens"), (b'"\\u0073tream"', "stream"), (b'"\\u006E"', "n")],
)
def test_a_second_copy_spelled_with_escapes_is_refused_too(spelled: bytes, param: str) -> None:
    # JSON decodes `"max_tok\u0065ns"` to `max_tokens`: a region would see two of them.
    value = b"true" if param == "stream" else b"1"
    body = (
        b'{"model":"a","messages":[{"role":"user","content":"caf\\u00e9"}],'
        + f'"{param}":'.encode()
        + value
        + b","
        + spelled
        + b":"
        + value
        + b"}"
    )
    with pytest.raises(InvalidRequest, match="more than once") as caught:
        parse_body(CHAT, body)
    assert caught.value.param == param
    # Alone, an escaped name is just that name; escapes in text are no key at all.
    alone = b'{"model":"a","messages":[{"role":"user","content":"caf\\u00e9"}],' + spelled
    assert parse_body(CHAT, alone + b":" + value + b"}").model == "a"


def _nested(depth: int) -> bytes:
    """A chat body whose deepest point is `depth` levels down (the body itself is one)."""
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return b'{"model":"m","messages":[{"role":"user","content":"[[{"}],"x":' + inner + b"}"


@pytest.mark.parametrize("depth", [128, 129, 944, 5000])
def test_a_body_nested_past_the_native_parsers_depth_is_a_400(depth: int) -> None:
    # A fixed bound, the native parser's: Python's decoders stop at a depth that depends on the
    # call stack, so a body that parsed here could fail a later decode deeper in the stack.
    if depth <= 128:
        assert parse_body(CHAT, _nested(depth)).model == "m"
    else:
        with pytest.raises(InvalidRequest, match="nested deeper than 128 levels"):
            parse_body(CHAT, _nested(depth))


@pytest.mark.parametrize(
    "doc",
    [[], {}, "[[", {"a": ["{", {"b": [[["]"]]]}]}, [1, [2, [3, [4]]], {"k": 'a "quote" \\ [['}]],
)
def test_nesting_steps_over_strings(doc: object) -> None:
    def depth(value: object) -> int:
        if isinstance(value, list):
            return 1 + max(map(depth, value), default=0)
        if isinstance(value, dict):
            return 1 + max(map(depth, value.values()), default=0)
        return 0

    assert nesting(json.dumps(doc).encode()) == depth(doc)


@pytest.mark.parametrize("field", ["max_tokens", "n", "max_completion_tokens"])
def test_a_token_field_of_more_digits_than_int_reads_is_a_400(field: str) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    raw = body[:-1].encode() + b', "%s": "%s"}' % (field.encode(), b"9" * 4301)
    with pytest.raises(InvalidRequest, match=f"`{field}` must be an integer"):
        parse_body(CHAT, raw)


def test_an_error_quotes_a_clients_value_cut_short() -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    raw = raw[:-1] + b', "max_tokens": "' + b"x" * 100_000 + b'"}'
    with pytest.raises(InvalidRequest) as caught:
        parse_body(CHAT, raw)
    assert "got 'xxx" in str(caught.value)
    assert len(str(caught.value)) < 200


_ONE_OF_EACH = {
    CHAT: CHAT_BODY,
    COMPLETIONS: {"prompt": "hi"},
    EMBEDDINGS: {"input": "hi"},
    RESPONSES: {"input": "hi"},
    INPUT_TOKENS: {"input": "hi"},
    MESSAGES: {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    COUNT_TOKENS: {"messages": [{"role": "user", "content": "hi"}]},
}


@pytest.mark.parametrize("endpoint", list(_ONE_OF_EACH))
def test_a_model_name_is_at_most_256_characters(endpoint: str) -> None:
    assert MAX_MODEL_CHARS == 256
    fields = _ONE_OF_EACH[endpoint]
    assert parse_body(endpoint, body({**fields, "model": "é" * 256})).model == "é" * 256
    with pytest.raises(InvalidRequest) as refused:
        parse_body(endpoint, body({**fields, "model": "m" * 300_000}))
    assert refused.value.param == "model"
    assert refused.value.status == 400
    assert len(str(refused.value)) < 200


@pytest.mark.parametrize(
    ("endpoint", "fields"),
    [
        (CHAT, {"max_tokens": "9" * 4300, "n": 10}),
        (CHAT, {"n": "9" * 30}),
        (CHAT, {"max_completion_tokens": 1e300}),
        (MESSAGES, {"max_tokens": 2**63}),
        (RESPONSES, {"max_output_tokens": str(2**63)}),
    ],
)
def test_a_token_field_past_64_bits_is_a_400(endpoint: str, fields: dict[str, object]) -> None:
    # Servers read them as 64-bit integers; a 4,300-digit one times `n` was a 500 (an int too
    # long to print) in the limits' refusal.
    body: dict[str, object] = {"model": "m", "max_tokens": 5, **fields}
    if endpoint == RESPONSES:
        body.pop("max_tokens")
        body["input"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    raw = json.dumps(body).encode()
    with pytest.raises(InvalidRequest, match=f"must be an integer from -?\\d+ to {2**63 - 1}"):
        parse_body(endpoint, raw)
    body.update({name: 2**63 - 1 for name in fields})
    parse_body(endpoint, json.dumps(body).encode())


def test_a_negative_length_is_llama_cpps_no_bound_where_it_reads_one() -> None:
    # llama.cpp's server reads max_tokens -1 as "until the context ends" and answers 200; other
    # servers refuse it themselves. Messages and Responses lengths are still at least 1.
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    parse_body(CHAT, json.dumps({**chat, "max_tokens": -1}).encode())
    parse_body(CHAT, json.dumps({**chat, "max_completion_tokens": -1}).encode())
    parse_body(COMPLETIONS, json.dumps({"model": "m", "prompt": "x", "max_tokens": -1}).encode())
    with pytest.raises(InvalidRequest, match="max_tokens"):
        parse_body(MESSAGES, json.dumps({**chat, "max_tokens": -1}).encode())
    with pytest.raises(InvalidRequest, match="max_output_tokens"):
        parse_body(
            RESPONSES, json.dumps({"model": "m", "input": "x", "max_output_tokens": -1}).encode()
        )
