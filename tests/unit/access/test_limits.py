"""Rate limits in process: header formats, token estimates, usage parsing, the Limiter's rules."""

from __future__ import annotations

import json
from dataclasses import replace

import msgspec
import pytest
from aiohttp import web

from router.access.auth import ANONYMOUS_TENANT, Tenant
from router.access.limits import Limiter, format_reset, rate_headers, retry_headers
from router.access.usage import StreamUsage, completion_budget, usage_tokens
from router.core.request import parse_body
from router.errors import InvalidRequest, RateLimited
from router.native import count_tokens

TENANT = Tenant(
    key_id="k1",
    name="t",
    models=None,
    requests_per_minute=60,
    tokens_per_minute=6000,
    request_burst=3,
    token_burst=1000,
    max_concurrent=None,
    priority=0,
    cache_namespace="t",
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0ms"), (0.0001, "1ms"), (0.25, "250ms"), (1, "1s"), (1.5, "1.5s"), (12.34, "12.4s"),
     (60, "1m0s"), (361, "6m1s"), (float("inf"), "1440m0s"), (-1, "0ms"),
     (300_000, "5000m0s")],  # a slow refill says how slow, past a day too
)  # fmt: skip
def test_format_reset_like_openai(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


def test_rate_headers_only_for_limited_dimensions() -> None:
    both = rate_headers(TENANT, 2, 900, 1.0, 0.5)
    assert both == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "500ms",
    }
    requests_only = replace(TENANT, tokens_per_minute=None)
    assert set(rate_headers(requests_only, 1, 0, 1, 1)) == {
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    }
    assert rate_headers(ANONYMOUS_TENANT, 1, 1, 1, 1) == {}


def test_retry_headers_round_up_and_never_say_zero() -> None:
    assert retry_headers(0.0) == {"Retry-After": "1", "retry-after-ms": "1"}
    assert retry_headers(2.0001) == {"Retry-After": "3", "retry-after-ms": "2001"}
    assert retry_headers(float("inf"))["Retry-After"] == "3600"
    assert retry_headers(float("nan"))["Retry-After"] == "3600"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, 256),
        ({"max_tokens": 10}, 10),
        ({"max_tokens": 10, "max_completion_tokens": 20}, 20),
        ({"max_tokens": 10, "n": 3}, 30),
        ({"max_tokens": 0}, 256),
    ],
)
def test_completion_budget(body: dict[str, int], expected: int) -> None:
    assert completion_budget(json.dumps({"model": "m", **body}).encode(), 256) == expected


@pytest.mark.parametrize(
    "field", [{"max_tokens": 5000.0}, {"max_tokens": "5000"}, {"max_completion_tokens": 5e3}]
)
def test_a_number_counts_however_it_is_written(field: dict[str, object]) -> None:
    # Issue 24: 5000.0, "5000" and 5e3 used to reserve the default 256 instead of 5000.
    assert completion_budget(json.dumps(field).encode(), 256) == 5000
    assert completion_budget(json.dumps({**field, "n": 2.0}).encode(), 256) == 10000


@pytest.mark.parametrize(
    "body",
    [
        b'{"max_tokens": "many"}',
        b'{"max_tokens": 1.5}',
        b'{"n": true}',
        b'{"n": 0}',
        b'{"n_cmpl": 0}',
    ],
)
def test_a_number_no_region_would_read_is_refused_not_defaulted(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        completion_budget(body, 99)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}', 7),
        (b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}}', 7),
        (b'{"usage": null, "choices": []}', None),
        (b'{"choices": []}', None),
        (b'{"usage": {}}', None),
        (b'not json but mentions "usage"', None),
    ],
)
def test_usage_tokens(payload: bytes, expected: int | None) -> None:
    assert usage_tokens(payload) == expected


STREAM = (
    b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(STREAM)])
def test_stream_usage_found_across_any_chunking(size: int) -> None:
    meter = StreamUsage()
    for i in range(0, len(STREAM), size):
        meter.feed(STREAM[i : i + size])
    assert meter.total_tokens == 7


def test_stream_without_usage_reports_none_unless_it_can_count() -> None:
    events = STREAM.split(b"\n\n")[0] + b"\n\ndata: [DONE]\n\n"
    meter = StreamUsage()
    meter.feed(events)
    assert meter.total_tokens is None
    assert meter.used() is None
    counting = StreamUsage(prompt_tokens=5, encoding="cl100k_base")
    counting.feed(events)
    assert counting.used() == 5 + count_tokens("hi", "cl100k_base")


def test_stream_text_of_chat_and_completions_is_counted() -> None:
    chat = b"".join(
        b'data: {"choices":[{"index":0,"delta":{"content":"' + w + b' "}}]}\n\n'
        for w in (b"one", b"two", b"three")
    )
    completion = b'data: {"choices":[{"index":0,"text":"one two three "}]}\n\ndata: [DONE]\n\n'
    for stream in (chat, completion):
        meter = StreamUsage(prompt_tokens=2, encoding="cl100k_base")
        meter.feed(stream)
        assert meter.used() == 2 + count_tokens("one two three ", "cl100k_base")


@pytest.mark.parametrize(
    "event",
    [
        b'{"choices":[{"index":0,"delta":{"reasoning_content":"one two three "}}]}',
        b'{"choices":[{"index":0,"delta":{"reasoning":"one two three "}}]}',
        b'{"choices":[{"index":0,"delta":{"refusal":"one two three "}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
        b'{"arguments":"one two three "}}]}}]}',
        b'{"choices":[{"index":0,"delta":{"function_call":{"arguments":"one two three "}}}]}',
        b'{"type":"response.reasoning_text.delta","delta":"one two three "}',
        b'{"type":"response.function_call_arguments.delta","delta":"one two three "}',
    ],
    ids=[
        "reasoning_content",
        "reasoning",
        "refusal",
        "tool_call",
        "function_call",
        "responses-reasoning",
        "responses-arguments",
    ],
)
def test_a_stream_s_reasoning_and_tool_calls_are_counted_too(event: bytes) -> None:
    # A stream left before its usage event is settled by its text: reasoning and tool calls
    # are generated tokens too (a client could otherwise leave such streams for the prompt's
    # price).
    meter = StreamUsage(prompt_tokens=2, encoding="cl100k_base")
    meter.feed(b"data: " + event + b"\n\n")
    assert meter.used() == 2 + count_tokens("one two three ", "cl100k_base")


@pytest.mark.parametrize(
    "delta",
    [
        # Servers moving from `reasoning_content` to `reasoning` send both.
        b'{"reasoning_content":"one two three ","reasoning":"one two three "}',
        # llama.cpp's deepseek-legacy format: the reasoning in `content` too.
        b'{"content":"<think>one two three </think>","reasoning_content":"one two three "}',
    ],
    ids=["both-fields", "deepseek-legacy"],
)
def test_one_reasoning_text_is_counted_once(delta: bytes) -> None:
    meter = StreamUsage(prompt_tokens=2, encoding="cl100k_base")
    meter.feed(b'data: {"choices":[{"index":0,"delta":' + delta + b"}]}\n\n")
    content = msgspec.json.decode(delta).get("content") or "one two three "
    assert meter.used() == 2 + count_tokens(content, "cl100k_base")


def test_reported_usage_wins_over_counting() -> None:
    meter = StreamUsage(prompt_tokens=100, encoding="cl100k_base")
    meter.feed(STREAM)
    assert meter.used() == 7


def test_estimate_is_prompt_plus_completion_budget() -> None:
    limiter = Limiter([TENANT], default_max_tokens=100)
    chat = parse_body(
        "/v1/chat/completions",
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hello world"}]}',
    )
    with_max = parse_body(
        "/v1/chat/completions",
        b'{"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hello"}]}',
    )
    embed = parse_body("/v1/embeddings", b'{"model": "text-embedding-3-small", "input": "a b c"}')
    prompt = limiter.estimate(chat) - 100
    assert 0 < prompt < 20
    assert 0 < limiter.estimate(with_max) - 5 < 20
    assert 0 < limiter.estimate(embed) < 10


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [("one", 1), (["a", "b", "c"], 3), ([[1, 2], [3]], 2), ([1, 2, 3], 1)],
)
def test_a_completions_batch_reserves_an_answer_per_prompt(prompt: object, prompts: int) -> None:
    # A batch of 100 prompts at max_tokens 2000 reserved 2,000 answer tokens, not 200,000.
    limiter = Limiter([TENANT], default_max_tokens=100)
    body = {"model": "gpt-4o", "prompt": prompt, "max_tokens": 50, "n": 2}
    parsed = parse_body("/v1/completions", json.dumps(body).encode())
    assert limiter.estimate_parts(parsed)[2] == 50 * 2 * prompts


async def test_requests_beyond_the_burst_get_429_with_retry_after() -> None:
    limiter = Limiter([TENANT])
    grants = [await limiter.admit(TENANT, 10) for _ in range(3)]
    assert [g.headers["x-ratelimit-remaining-requests"] for g in grants] == ["2", "1", "0"]
    with pytest.raises(RateLimited) as caught:
        await limiter.admit(TENANT, 10)
    headers = caught.value.headers
    assert caught.value.status == 429
    assert headers["Retry-After"] == "1"
    assert 0 < int(headers["retry-after-ms"]) <= 1000
    assert headers["x-ratelimit-remaining-requests"] == "0"


async def test_finish_gives_back_unused_tokens() -> None:
    tenant = replace(TENANT, request_burst=10)
    limiter = Limiter([tenant])
    first = await limiter.admit(tenant, 900)
    assert int(first.headers["x-ratelimit-remaining-tokens"]) <= 100
    with pytest.raises(RateLimited):
        await limiter.admit(tenant, 900)
    first.finish(50)
    first.finish(0)  # only the first call counts
    second = await limiter.admit(tenant, 900)
    assert int(second.headers["x-ratelimit-remaining-tokens"]) <= 100
    # Using more than reserved takes the excess: the bucket goes into debt.
    second.finish(1900)
    with pytest.raises(RateLimited):
        await limiter.admit(tenant, 1)


async def test_unknown_usage_keeps_the_reservation() -> None:
    tenant = replace(TENANT, request_burst=10)
    limiter = Limiter([tenant])
    (await limiter.admit(tenant, 900)).finish(None)
    with pytest.raises(RateLimited):
        await limiter.admit(tenant, 900)


@pytest.mark.parametrize("total", [-99995, 10**15, 10**19, "7"])
async def test_a_regions_impossible_usage_is_unknown_and_keeps_the_reservation(
    total: object,
) -> None:
    # A negative total refilled the key's bucket on every answer (limits bypassed), one past
    # 64 bits raised in the bucket table (an unhandled error, the request unrecorded).
    tenant = replace(TENANT, request_burst=10)
    limiter = Limiter([tenant])
    grant = await limiter.admit(tenant, 900)
    body = json.dumps({"choices": [], "usage": {"total_tokens": total}}).encode()
    grant.settle(web.Response(body=body, content_type="application/json"), True)
    with pytest.raises(RateLimited):
        await limiter.admit(tenant, 900)
    assert usage_tokens(body) is None


async def test_a_request_bigger_than_the_bucket_is_refused_for_good() -> None:
    limiter = Limiter([TENANT])
    with pytest.raises(RateLimited) as caught:
        await limiter.admit(TENANT, 1001)
    assert caught.value.code == "request_too_large"
    assert caught.value.headers == {"x-should-retry": "false"}


async def test_max_concurrent_counts_until_finish() -> None:
    tenant = replace(TENANT, requests_per_minute=None, tokens_per_minute=None, max_concurrent=2)
    limiter = Limiter([tenant])
    a = await limiter.admit(tenant, 0)
    b = await limiter.admit(tenant, 0)
    with pytest.raises(RateLimited) as caught:
        await limiter.admit(tenant, 0)
    assert caught.value.code == "concurrency_limit_exceeded"
    assert caught.value.headers == {"Retry-After": "1", "retry-after-ms": "1000"}
    a.finish(None)
    c = await limiter.admit(tenant, 0)
    assert a.headers == {}
    b.finish(None)
    c.finish(None)


async def test_unlimited_tenant_is_always_admitted() -> None:
    limiter = Limiter([ANONYMOUS_TENANT])
    for _ in range(100):
        (await limiter.admit(ANONYMOUS_TENANT, 10**9)).finish(None)


@pytest.mark.parametrize(
    ("endpoint", "body", "expected"),
    [
        # Another API's length field bounds nothing where no region reads it.
        ("/v1/messages", {"max_tokens": 5000, "max_completion_tokens": 1}, 5000),
        ("/v1/responses", {"max_output_tokens": 5000, "max_tokens": 1}, 5000),
        ("/v1/chat/completions", {"max_output_tokens": 1}, 256),
        ("/v1/completions", {"max_tokens": 7, "max_completion_tokens": 1, "n": 2}, 14),
        ("/v1/messages", {"max_tokens": 10, "n": 3}, 10),
        # llama.cpp's server reads its own fields first (and a Responses body's chat fields):
        # the most any region could generate is reserved.
        ("/v1/chat/completions", {"max_tokens": 10, "n_predict": 100000}, 100000),
        ("/v1/chat/completions", {"max_tokens": 10, "n_predict": 5}, 10),
        # A negative n_predict is no bound at all for llama.cpp: the default, not max_tokens.
        ("/v1/chat/completions", {"max_tokens": 10, "n_predict": -1}, 256),
        ("/v1/chat/completions", {"max_tokens": 3, "n_predict": -2}, 256),
        ("/v1/chat/completions", {"max_tokens": 1000, "n_predict": -1}, 1000),
        ("/v1/chat/completions", {"n_predict": -1}, 256),
        # And so is a negative max_tokens (llama.cpp reads it; others refuse it themselves).
        ("/v1/chat/completions", {"max_tokens": -1}, 256),
        ("/v1/completions", {"max_tokens": -1, "n": 2}, 512),
        # The first field set decides: -1 there is no bound (the default), whatever follows.
        ("/v1/chat/completions", {"max_completion_tokens": -1, "max_tokens": 30}, 256),
        ("/v1/completions", {"max_tokens": 10, "n_cmpl": 16}, 160),
        ("/v1/completions", {"max_tokens": 10, "n_cmpl": 2, "n": 3}, 30),
        ("/v1/responses", {"max_tokens": 100000}, 100000),
        ("/v1/responses", {"max_output_tokens": 10, "n_predict": 5000}, 5000),
        ("/v1/messages", {"max_tokens": 10, "n_predict": 5000}, 5000),
    ],
)
def test_completion_budget_reads_the_fields_of_the_requests_api(
    endpoint: str, body: dict[str, int], expected: int
) -> None:
    assert completion_budget(json.dumps(body).encode(), 256, endpoint) == expected


def _events(*payloads: dict[str, object]) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads)


def test_typed_event_streams_are_counted_by_their_text_until_their_usage_comes() -> None:
    from router.native import count_tokens

    words = ["Hello", " there", ", friend"]
    responses = StreamUsage(10, "cl100k_base")
    responses.feed(_events(*({"type": "response.output_text.delta", "delta": w} for w in words)))
    assert responses.used() == 10 + count_tokens("".join(words), "cl100k_base")
    # Messages: message_start reports the input (and a placeholder output): counting goes on.
    messages = StreamUsage(10, "cl100k_base")
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 7, "output_tokens": 1}}}
    texts = (
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": w}} for w in words
    )
    messages.feed(_events(start, *texts))
    assert messages.used() == 7 + count_tokens("".join(words), "cl100k_base")
    # Its closing usage is the answer's.
    messages.feed(_events({"type": "message_delta", "usage": {"output_tokens": 30}}))
    assert messages.used() == 37
