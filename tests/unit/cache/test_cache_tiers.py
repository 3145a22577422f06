"""ResponseCache with an injected key function: rules, keys, tier 1, purge, stats (no sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json

import msgspec
import pytest

from router.cache.coalescing import Flight, FlightFailed
from router.cache.policy import CacheControl, Entry, Level, Rule, XCache, decide
from router.cache.redis_tier import RedisTier, redis_key
from router.cache.serving import (
    Tap,
    _forwarded,
    _Knobs,
    answer_shape,
    fields_of,
    knobs,
    native_key_fn,
)
from router.cache.tiers import ResponseCache
from router.config import CacheConfig, CacheModelConfig
from router.core.context import RequestContext
from router.core.request import _ACTED, CHAT, MESSAGES, RESPONSES, parse_body
from router.net import sse


def key_fn(body: bytes, namespace: str, level: Level) -> bytes:
    # Stands in for the Rust fingerprint: any 16-byte function of all three inputs.
    return hashlib.blake2b(
        body + b"\0" + namespace.encode() + level.encode(), digest_size=16
    ).digest()


def make(**kw: object) -> ResponseCache:
    now = [1000.0]
    cache = ResponseCache(CacheConfig(enabled=True, **kw), key_fn, clock=lambda: now[0])  # type: ignore[arg-type]
    return cache


async def test_put_then_get_in_the_same_namespace_only() -> None:
    cache = make()
    rule = cache.rule("m")
    key = cache.key(
        b"{}", namespace="a", level=rule.level, endpoint="/v1/chat/completions", stream=False
    )
    entry = cache.new_entry(
        namespace="a", model="m", rule=rule, content_type="application/json", body=b"{}"
    )
    cache.put(key, entry)
    assert await cache.get(key, "a", "m") is entry
    assert await cache.get(key, "b", "m") is None
    other = cache.key(
        b"{}", namespace="b", level=rule.level, endpoint="/v1/chat/completions", stream=False
    )
    assert other != key


def test_key_depends_on_level_endpoint_stream_and_usage() -> None:
    cache = make()
    keys = {
        cache.key(b"{}", namespace="a", level=level, endpoint=ep, stream=stream, usage=usage)
        for level in ("exact", "normalized")
        for ep in ("/v1/chat/completions", "/v1/completions")
        for stream, usage in ((False, False), (True, False), (True, True))
    }
    assert len(keys) == 12


def test_embeddings_key_every_character_of_their_input_at_any_level() -> None:
    # At `normalized`, "hello  world " and "hello world" ask the same question of a chat model;
    # an embedding of each is another vector. (The Rust fingerprint, not the stand-in.)
    cache = ResponseCache(CacheConfig(enabled=True), native_key_fn())

    def key(endpoint: str, body: dict[str, object]) -> bytes:
        raw = json.dumps({"model": "m", **body}).encode()
        return cache.key(raw, namespace="a", level="normalized", endpoint=endpoint, stream=False)

    chat = (
        [{"role": "user", "content": "hello  world "}],
        [{"role": "user", "content": "hello world"}],
    )
    assert key("/v1/chat/completions", {"messages": chat[0]}) == key(
        "/v1/chat/completions", {"messages": chat[1]}
    )
    assert key("/v1/embeddings", {"input": "hello  world "}) != key(
        "/v1/embeddings", {"input": "hello world"}
    )


def test_entry_expires_after_the_rule_ttl() -> None:
    cache = make(ttl_s=10, models={"short": CacheModelConfig(ttl_s=1)})
    e = cache.new_entry(namespace="a", model="short", rule=cache.rule("short"), content_type="x")
    assert e.expires - e.created == 1
    assert cache.rule("other").ttl_s == 10


async def test_purge_and_stats() -> None:
    cache = make()
    rule = cache.rule("m")
    for ns, model in (("a", "m"), ("a", "n"), ("b", "m")):
        k = cache.key(
            ns.encode() + model.encode(), namespace=ns, level="exact", endpoint="/e", stream=False
        )
        cache.put(
            k, cache.new_entry(namespace=ns, model=model, rule=rule, content_type="x", body=b"1")
        )
    cache.count(XCache.HIT)
    cache.count(XCache.MISS)
    cache.count(XCache.BYPASS)
    stats = cache.stats()
    assert stats["entries"] == 3
    assert stats["hit_ratio"] == 0.5
    assert stats["bypasses"] == 1
    assert "redis" not in stats
    assert await cache.purge(namespace="a") == 2
    assert await cache.purge(model="m") == 1
    assert cache.stats()["entries"] == 0
    assert cache.stats()["bytes"] == 0


def test_rules_are_memoized_but_bounded() -> None:
    cache = make()
    assert cache.rule("m") is cache.rule("m")
    for i in range(5000):
        cache.rule(f"model-{i}")
    assert len(cache._rules) <= 4097


def test_every_field_the_cache_reads_may_appear_once_only() -> None:
    # The cache reads the last copy of a field; a region may read the first: request parsing
    # refuses a second top-level copy of each (core.request._ACTED), this list included.
    names = {f.encode_name for f in msgspec.structs.fields(_Knobs)}
    assert "service_tier" in names
    assert names <= set(_ACTED)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"model":"m"}',
            {
                "temperature": None,
                "n": None,
                "tools": None,
                "functions": None,
                "mcp_servers": None,
                "web_search_options": None,
                "dynatemp_range": None,
                "samplers": None,
                "xtc_probability": None,
                "xtc_threshold": None,
                "n_cmpl": None,
            },
        ),
        (
            b'{"temperature":0.2,"n":1,"tools":[{"type":"function"}],"messages":[],"n_cmpl":2}',
            {
                "temperature": 0.2,
                "n": 1,
                "tools": [{"type": "function"}],
                "functions": None,
                "mcp_servers": None,
                "web_search_options": None,
                "dynatemp_range": None,
                "samplers": None,
                "xtc_probability": None,
                "xtc_threshold": None,
                "n_cmpl": 2,
            },
        ),
    ],
)
def test_knobs_reads_only_the_policy_fields(body: bytes, expected: dict[str, object]) -> None:
    assert knobs(body) == expected


def test_the_usual_request_adds_nothing_to_its_key() -> None:
    usual = b'{"model":"m","user":"u","metadata":{"a":1},"stream_options":{"include_usage":true}}'
    for endpoint in (CHAT, MESSAGES):
        assert answer_shape(fields_of(usual), endpoint, True, ()) == b""
    cache = make()
    plain = cache.key(usual, namespace="a", level="exact", endpoint=CHAT, stream=True)
    assert plain == cache.key(
        usual, namespace="a", level="exact", endpoint=CHAT, stream=True, shape=b""
    )


@pytest.mark.parametrize(
    ("endpoint", "stream", "body", "headers"),
    [
        (CHAT, False, b"{}", (("anthropic-beta", "x"),)),
        (CHAT, False, b'{"service_tier":"flex"}', ()),
        (CHAT, True, b'{"stream_options":{"continuous_usage_stats":true}}', ()),
        (RESPONSES, False, b'{"metadata":{"a":"1"}}', ()),
        (RESPONSES, False, b'{"user":"u"}', ()),
        (RESPONSES, False, b'{"prompt_cache_key":"k"}', ()),
        (RESPONSES, False, b'{"safety_identifier":"s"}', ()),
    ],
)
def test_what_shapes_an_answer_splits_both_tiers_keys(
    endpoint: str, stream: bool, body: bytes, headers: tuple[tuple[str, str], ...]
) -> None:
    cache = make()
    shape = answer_shape(fields_of(body), endpoint, stream, headers)
    assert shape
    plain = cache.key(body, namespace="a", level="exact", endpoint=endpoint, stream=stream)
    shaped = cache.key(
        body, namespace="a", level="exact", endpoint=endpoint, stream=stream, shape=shape
    )
    assert shaped != plain
    assert redis_key("p", shaped, "a", "m") != redis_key("p", plain, "a", "m")


def test_the_shape_does_not_depend_on_field_order() -> None:
    one = fields_of(b'{"metadata":{"a":"1","b":"2"},"user":"u"}')
    two = fields_of(b'{"user":"u","metadata":{"b":"2","a":"1"}}')
    assert answer_shape(one, RESPONSES, False, ()) == answer_shape(two, RESPONSES, False, ())


def test_rule_default_is_conservative() -> None:
    assert make().rule("m") == Rule()


def ctx_for(body: bytes, *, stream: bool = False) -> RequestContext:
    ctx = RequestContext("req-1", CHAT)
    ctx.parsed = parse_body(CHAT, body)
    assert ctx.request.stream is stream
    return ctx


CHAT_BODY = b'{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}]}'
OK_BODY = b'{"choices":[{"index":0,"message":{"content":"yo"},"finish_reason":"stop"}]}'


async def test_tap_shares_a_regions_error_with_followers_but_never_stores_it() -> None:
    cache = make()
    ctx = ctx_for(CHAT_BODY)
    flight, leads = cache.flights.join(b"k")
    assert leads
    follower = asyncio.create_task(flight.result())
    tap = Tap(cache, ctx, b"k", "t", cache.rule("m"), store=True, flight=flight)
    with cache.flights.lead(flight):
        tap.body(400, {"Content-Type": "application/json"}, b'{"error":{"message":"bad"}}')
    shared = await follower
    assert shared.status == 400
    assert shared.body == b'{"error":{"message":"bad"}}'
    assert len(cache.memory) == 0


def _delta_event(text: str) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n"


@pytest.mark.parametrize("followed", [False, True])
async def test_a_stream_past_max_entry_bytes_is_kept_only_while_someone_follows_it(
    followed: bool,
) -> None:
    # With coalescing, a cacheable stream was kept whole whatever its size, followed or not.
    cache = make(max_entry_bytes=1024)
    ctx = ctx_for(CHAT_BODY.replace(b'"temperature"', b'"stream":true,"temperature"'), stream=True)
    flight, _ = cache.flights.join(b"k")
    if followed:
        assert not cache.flights.join(b"k")[1]
    tap = Tap(cache, ctx, b"k", "t", cache.rule("m"), store=True, flight=flight)
    with contextlib.suppress(FlightFailed), cache.flights.lead(flight):
        for _ in range(100):
            tap.chunk(_delta_event("x" * 50))
        kept = sum(map(len, flight.chunks))
        if followed:
            assert kept > 5000  # its follower reads it from its start
            assert len(cache.flights) == 1
        else:
            assert kept < 2048
            assert len(cache.flights) == 0  # nobody joins it any more
            assert cache.flights.join(b"k")[1]


async def test_tap_stores_a_clean_body_and_respects_no_store() -> None:
    cache = make()
    ctx = ctx_for(CHAT_BODY)
    Tap(cache, ctx, b"k", "t", cache.rule("m"), store=True, flight=None).body(
        200, {"Content-Type": "application/json"}, OK_BODY
    )
    Tap(cache, ctx, b"n", "t", cache.rule("m"), store=False, flight=None).body(
        200, {"Content-Type": "application/json"}, OK_BODY
    )
    stored = await cache.get(b"k", "t", "m")
    assert stored is not None
    assert stored.body == OK_BODY
    assert await cache.get(b"n", "t", "m") is None


async def test_tap_stream_is_stored_only_when_clean_and_followers_see_whole_events() -> None:
    cache = make()
    ctx = ctx_for(
        CHAT_BODY.replace(b'"temperature":0', b'"temperature":0,"stream":true'), stream=True
    )
    chunk = b'{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}'
    raw = sse.encode(chunk) + sse.encode_done()
    for clean, key in ((False, b"broken"), (True, b"clean")):
        flight, _ = cache.flights.join(key)
        follower = asyncio.create_task(collect(flight))
        tap = Tap(cache, ctx, key, "t", cache.rule("m"), store=True, flight=flight)
        with contextlib.suppress(FlightFailed), cache.flights.lead(flight):
            tap.chunk(raw[:10])
            tap.chunk(raw[10:])
            tap.end(clean)
        got = await follower
        assert got == ([sse.encode(chunk), sse.encode_done()] if clean else None)
        assert (await cache.get(key, "t", "m") is not None) is clean


async def collect(flight: Flight[Entry]) -> list[bytes] | None:
    try:
        return [c async for c in flight.follow()]
    except FlightFailed:
        return None


async def test_tier_two_is_raced_only_when_it_can_answer_first() -> None:
    # A RedisTier never connects until asked; only its measured round trip is read here.
    tier = RedisTier("redis://127.0.0.1:1/0")
    cache = ResponseCache(CacheConfig(enabled=True), key_fn, redis=tier)
    try:
        assert cache.shared_may_win("m")  # nothing measured: race (and so measure)
        tier.rtt_s = 0.080
        cache.answered("m", 0.002)  # the region answers in 2 ms: an 80 ms lookup cannot win
        assert not cache.shared_may_win("m")
        assert cache.shared_may_win("other-model")
        for _ in range(40):
            cache.answered("m", 0.300)  # the region got slow: racing pays again
        assert cache.shared_may_win("m")
        assert not cache.shared_first()  # 80 ms is not "near": never asked before the region
        tier.rtt_s = 0.0003
        assert cache.shared_first()
        assert not make().shared_may_win("m")  # no tier 2 at all
    finally:
        await tier.close()


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (b'"dynatemp_range":1.5', "temperature"),
        (b'"n_cmpl":2', "n"),
        (b'"n_cmpl":1', ""),
        (b'"xtc_probability":0.5', "temperature"),
        (b'"xtc_probability":0.5,"xtc_threshold":0.6', ""),
    ],
)
def test_llama_cpps_sampling_fields_reach_the_policy(extra: bytes, reason: str) -> None:
    # The policy read them, but the body fields it was given left them out: cached anyway.
    body = b'{"model":"m","temperature":0,' + extra + b',"messages":[]}'
    assert decide(knobs(body), Rule(), CacheControl()).reason == reason


def test_only_tracing_headers_of_amazon_are_left_out_of_the_key() -> None:
    # Bedrock and SageMaker headers (guardrails, target variants) change the answer.
    assert _forwarded({"X-Amzn-Trace-Id": "Root=1-2", "Accept": "x"}) == ()
    shaping = {"X-Amzn-Bedrock-GuardrailIdentifier": "g1"}
    assert _forwarded(shaping) == (("x-amzn-bedrock-guardrailidentifier", "g1"),)
