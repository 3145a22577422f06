"""Tier 1 store (LRU by bytes, TTL), cacheability policy, Cache-Control, and the stream tee."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.cache.policy import (
    CacheControl,
    Entry,
    MemoryStore,
    Rule,
    StreamRecorder,
    complete_body,
    decide,
    parse_cache_control,
    resolve_rule,
    storage_key,
    stored_stream,
)
from router.cache.redis_tier import decode_entry, encode_entry, redis_key
from router.config import CacheConfig, CacheModelConfig
from router.net import sse


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(
    body: bytes = b"x" * 100,
    *,
    ns: str = "t",
    model: str = "m",
    ttl: float = 60.0,
    now: float = 1000.0,
) -> Entry:
    return Entry(
        namespace=ns,
        model=model,
        content_type="application/json",
        created=now,
        expires=now + ttl,
        body=body,
    )


def test_hit_after_put_and_age_counts_whole_seconds() -> None:
    clock = Clock()
    store = MemoryStore(10_000, clock)
    e = entry()
    assert store.put(b"k", e)
    assert store.get(b"k", "t") is e
    clock.now += 2.7
    assert e.age(clock()) == 2


def test_ttl_expiry_drops_the_entry() -> None:
    clock = Clock()
    store = MemoryStore(10_000, clock)
    store.put(b"k", entry(ttl=5))
    clock.now += 4.9
    assert store.get(b"k", "t") is not None
    clock.now += 0.2
    assert store.get(b"k", "t") is None
    assert len(store) == 0
    assert store.size == 0
    assert store.stats.expirations == 1


def test_eviction_is_by_bytes_least_recently_used_first() -> None:
    one = entry().size()
    store = MemoryStore(3 * one, Clock())
    for k in (b"a", b"b", b"c"):
        store.put(k, entry())
    assert store.get(b"a", "t") is not None  # a is now the most recent; b the least
    store.put(b"d", entry())
    assert store.get(b"b", "t") is None
    assert all(store.get(k, "t") is not None for k in (b"a", b"c", b"d"))
    assert store.size <= 3 * one
    assert store.stats.evictions == 1


def test_one_big_entry_evicts_many_small_ones() -> None:
    small = entry(b"s").size()
    store = MemoryStore(10 * small, Clock())
    for i in range(10):
        store.put(bytes([i]), entry(b"s"))
    big = entry(b"B" * (5 * small))
    assert store.put(b"big", big)
    assert store.size <= 10 * small
    assert len(store) < 10


def test_entry_larger_than_bound_is_refused_and_nothing_is_evicted() -> None:
    store = MemoryStore(1000, Clock())
    store.put(b"a", entry(b"a"))
    assert not store.put(b"huge", entry(b"h" * 2000))
    assert store.get(b"a", "t") is not None
    assert store.stats.rejected == 1


def test_replacing_a_key_keeps_byte_accounting_exact() -> None:
    store = MemoryStore(100_000, Clock())
    store.put(b"k", entry(b"1" * 10))
    store.put(b"k", entry(b"2" * 500))
    assert len(store) == 1
    assert store.size == entry(b"2" * 500).size()


def test_namespace_mismatch_never_returns_the_entry() -> None:
    store = MemoryStore(10_000, Clock())
    store.put(b"k", entry(ns="tenant-a"))
    assert store.get(b"k", "tenant-b") is None
    assert store.get(b"k", "tenant-a") is not None


def test_purge_by_namespace_model_and_all() -> None:
    store = MemoryStore(100_000, Clock())
    store.put(b"1", entry(ns="a", model="m1"))
    store.put(b"2", entry(ns="a", model="m2"))
    store.put(b"3", entry(ns="b", model="m1"))
    assert store.purge(namespace="a", model="m1") == 1
    assert store.purge(model="m1") == 1
    assert store.purge(namespace="b") == 0
    assert store.purge() == 1
    assert len(store) == 0
    assert store.size == 0


def test_stream_entry_size_counts_chunks() -> None:
    e = Entry(
        namespace="t",
        model="m",
        content_type="text/event-stream",
        created=0,
        expires=1,
        chunks=(b"a" * 10, b"b" * 20),
        stream=True,
    )
    assert e.size() > 30 + entry(b"").size()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, CacheControl()),
        ("", CacheControl()),
        ("no-cache", CacheControl(no_cache=True)),
        ("No-Store", CacheControl(no_store=True)),
        ("max-age=0, no-store , no-cache", CacheControl(no_cache=True, no_store=True)),
        ("private", CacheControl()),
    ],
)
def test_parse_cache_control(value: str | None, expected: CacheControl) -> None:
    assert parse_cache_control(value) == expected


@pytest.mark.parametrize(
    ("request_body", "rule", "reason"),
    [
        ({}, Rule(), "temperature unset"),
        ({}, Rule(cache_unset_temperature=True), ""),
        ({"temperature": 0}, Rule(), ""),
        ({"temperature": 0.0, "n": 1}, Rule(), ""),
        ({"temperature": 0.7}, Rule(), "temperature"),
        ({"temperature": 0.7}, Rule(max_temperature=1.0), ""),
        ({"temperature": "hot"}, Rule(), "temperature"),
        ({"temperature": 0, "n": 2}, Rule(), "n"),
        ({"temperature": 0, "tools": [{"type": "function"}]}, Rule(), "tools"),
        ({"temperature": 0, "functions": [{"name": "f"}]}, Rule(), "tools"),
        ({"temperature": 0, "tools": [{"type": "function"}]}, Rule(allow_tools=True), ""),
        ({"temperature": 0, "tools": []}, Rule(), ""),
        # Tools by other names: answers that read an MCP server or the web.
        ({"temperature": 0, "mcp_servers": [{"type": "url", "url": "u"}]}, Rule(), "tools"),
        ({"temperature": 0, "web_search_options": {}}, Rule(), "tools"),
        ({"temperature": 0, "web_search_options": {}}, Rule(allow_tools=True), ""),
        ({"temperature": 0, "mcp_servers": []}, Rule(), ""),
        ({"temperature": 0}, Rule(enabled=False), "disabled"),
        # llama.cpp's server: a dynamic temperature range samples at temperature 0 too, and
        # its own n_cmpl asks for several choices.
        ({"temperature": 0, "dynatemp_range": 0.5}, Rule(), "temperature"),
        ({"temperature": 0, "dynatemp_range": "wide"}, Rule(), "temperature"),
        ({"temperature": 0, "dynatemp_range": 0}, Rule(), ""),
        # A sampler chain without the temperature sampler draws at random at temperature 0;
        # one with it (by any of its names, or 't' in the string form) is greedy.
        ({"temperature": 0, "samplers": ["top_k", "top_p", "min_p"]}, Rule(), "temperature"),
        ({"temperature": 0, "samplers": "kpx"}, Rule(), "temperature"),
        ({"temperature": 0, "samplers": []}, Rule(), "temperature"),
        ({"temperature": 0, "samplers": ["top_k", 7]}, Rule(), "temperature"),
        ({"temperature": 0, "samplers": ["top_k", "Temperature"]}, Rule(), ""),
        ({"temperature": 0, "samplers": ["temp"]}, Rule(), ""),
        ({"temperature": 0, "samplers": "kt"}, Rule(), ""),
        ({"temperature": 0, "samplers": None}, Rule(), ""),
        # XTC draws before the temperature sampler (the default chain, or a custom one that
        # runs it first) when on: a probability above 0, a threshold of 0.5 at most.
        ({"temperature": 0, "xtc_probability": 0.5}, Rule(), "temperature"),
        ({"temperature": 0, "xtc_probability": 1, "xtc_threshold": 0.5}, Rule(), "temperature"),
        ({"temperature": 0, "xtc_probability": 0.5, "xtc_threshold": "x"}, Rule(), "temperature"),
        ({"temperature": 0, "xtc_probability": "often"}, Rule(), "temperature"),
        ({"temperature": 0, "xtc_probability": 0.5, "samplers": "kxt"}, Rule(), "temperature"),
        (
            {"temperature": 0, "xtc_probability": 0.5, "samplers": ["XTC", "temp"]},
            Rule(),
            "temperature",
        ),
        ({"temperature": 0, "xtc_probability": 0}, Rule(), ""),
        ({"temperature": 0, "xtc_probability": 0.5, "xtc_threshold": 0.51}, Rule(), ""),
        ({"temperature": 0, "xtc_probability": 0.5, "samplers": "ktx"}, Rule(), ""),
        ({"temperature": 0, "xtc_probability": 0.5, "samplers": ["top_k", "temp"]}, Rule(), ""),
        ({"temperature": 0, "n_cmpl": 3}, Rule(), "n"),
        ({"temperature": 0, "n_cmpl": 1}, Rule(), ""),
    ],
)
def test_policy(request_body: dict[str, object], rule: Rule, reason: str) -> None:
    d = decide(request_body, rule, CacheControl())
    assert d.reason == reason
    assert d.lookup is d.store is (reason == "")


def test_embeddings_are_cacheable_without_a_temperature() -> None:
    assert decide({}, Rule(), CacheControl(), sampled=False).reason == ""
    assert decide({}, Rule(), CacheControl()).reason == "temperature unset"
    assert decide({"n": 2}, Rule(), CacheControl(), sampled=False).reason == "n"


def test_cache_control_splits_lookup_and_store() -> None:
    body = {"temperature": 0}
    d = decide(body, Rule(), CacheControl(no_cache=True))
    assert (d.lookup, d.store) == (False, True)
    d = decide(body, Rule(), CacheControl(no_store=True))
    assert (d.lookup, d.store) == (True, False)
    assert decide(body, Rule(), CacheControl(no_cache=True, no_store=True)).bypass
    assert not decide(body, Rule(), CacheControl()).bypass


def test_rule_overlays_per_model_overrides() -> None:
    config = CacheConfig(
        enabled=True,
        level="exact",
        ttl_s=10,
        models={
            "big": CacheModelConfig(level="normalized", max_temperature=0.5, enabled=None),
            "off": CacheModelConfig(enabled=False),
        },
    )
    assert resolve_rule(config, "other") == Rule(level="exact", ttl_s=10)
    assert resolve_rule(config, "big") == Rule(level="normalized", ttl_s=10, max_temperature=0.5)
    assert not resolve_rule(config, "off").enabled
    assert not resolve_rule(CacheConfig(enabled=False, models=config.models), "big").enabled


def chat(finish: str | None) -> bytes:
    return msgspec.json.encode(
        {"choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": finish}]}
    )


@pytest.mark.parametrize(
    ("body", "ok"),
    [
        (chat("stop"), True),
        (chat("length"), True),
        (chat("tool_calls"), False),
        (chat(None), False),
        (b'{"choices": []}', False),
        (b'{"error": {"message": "x"}}', False),
        (b'{"data": [{"embedding": [0.1]}]}', True),
        (b"not json", False),
        (b"[1]", False),
    ],
)
def test_complete_body(body: bytes, ok: bool) -> None:
    assert complete_body(body) is ok


def stream_chunk(content: str, finish: str | None = None, index: int = 0) -> bytes:
    return msgspec.json.encode(
        {"choices": [{"index": index, "delta": {"content": content}, "finish_reason": finish}]}
    )


def raw_stream(*payloads: bytes) -> bytes:
    return b"".join(sse.encode(p) for p in payloads)


def test_recorder_commits_only_after_clean_finish_and_done() -> None:
    rec = StreamRecorder()
    raw = raw_stream(stream_chunk("a"), stream_chunk("b", "stop"), b'{"choices":[],"usage":{}}')
    # Feed in awkward pieces: the tee sees whatever chunking the socket gives.
    for i in range(0, len(raw), 7):
        rec.feed(raw[i : i + 7])
    assert not rec.complete
    rec.feed(sse.encode_done())
    assert rec.complete
    # Whole events, as they were relayed: replayed joined.
    assert rec.chunks == [
        sse.encode(stream_chunk("a")),
        sse.encode(stream_chunk("b", "stop")),
        sse.encode(b'{"choices":[],"usage":{}}'),
        sse.encode_done(),
    ]
    assert b"".join(rec.chunks) == raw + sse.encode_done()


@pytest.mark.parametrize("finish", [None, "tool_calls", "content_filter"])
def test_recorder_rejects_unclean_finish(finish: str | None) -> None:
    rec = StreamRecorder()
    rec.feed(raw_stream(stream_chunk("a"), stream_chunk("", finish), sse.DONE))
    assert not rec.complete


def test_recorder_rejects_aborted_errored_and_garbage_streams() -> None:
    aborted = StreamRecorder()
    aborted.feed(raw_stream(stream_chunk("a", "stop")))
    aborted.fail()
    aborted.feed(sse.encode_done())
    assert not aborted.complete
    errored = StreamRecorder()
    errored.feed(raw_stream(stream_chunk("a", "stop"), b'{"error": {"message": "x"}}', sse.DONE))
    assert not errored.complete
    garbage = StreamRecorder()
    garbage.feed(raw_stream(b"{not json", stream_chunk("a", "stop"), sse.DONE))
    assert not garbage.complete


def test_recorder_needs_every_choice_finished() -> None:
    rec = StreamRecorder()
    rec.feed(
        raw_stream(
            stream_chunk("a", index=0),
            stream_chunk("b", index=1),
            stream_chunk("", "stop", index=0),
            sse.DONE,
        )
    )
    assert not rec.complete


def test_sse_decoder_handles_crlf_comments_and_multiline_data() -> None:
    d = sse.Decoder()
    out = d.feed(b": keepalive\r\n\r\nevent: x\r\ndata: a\r\ndata:b\r\n\r\ndata: [DONE]\n")
    assert out == [b"a\nb"]
    assert d.pending
    assert d.feed(b"\n") == [sse.DONE]
    assert not d.pending


def test_storage_key_separates_stream_and_endpoint() -> None:
    fp = b"\x01" * 16
    keys = {
        storage_key(fp, endpoint="/v1/chat/completions", stream=True),
        storage_key(fp, endpoint="/v1/chat/completions", stream=False),
        storage_key(fp, endpoint="/v1/chat/completions", stream=True, usage=True),
        storage_key(fp, endpoint="/v1/completions", stream=False),
    }
    assert len(keys) == 4


def test_redis_envelope_round_trips_and_rejects_other_versions() -> None:
    e = Entry(
        namespace="t",
        model="m",
        content_type="text/event-stream",
        created=1.0,
        expires=2.0,
        chunks=(b"a", b"b"),
        stream=True,
    )
    blob = encode_entry(e)
    assert blob.startswith(b"RC\x02")
    assert decode_entry(blob, 1 << 20) == e
    assert decode_entry(b"RC\x01" + blob[3:], 1 << 20) is None
    assert decode_entry(b"RC\x03" + blob[3:], 1 << 20) is None
    assert decode_entry(blob[:-3], 1 << 20) is None
    assert decode_entry(blob + b"x", 1 << 20) is None
    assert decode_entry(b"", 1 << 20) is None


def test_a_stored_form_is_read_back_from_its_key() -> None:
    fp = b"\x00" * 16
    for endpoint in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        for stream, usage in ((False, False), (True, False), (True, True)):
            # With what else shapes the answer (a forwarded header, service_tier) too: the
            # shared tier reads the form to check an entry (a stream read as a body's key was
            # a miss for every shaped stream).
            for shape in (b"", b"openai-organization: org", b"|S", b"|B"):
                key = storage_key(fp, endpoint=endpoint, stream=stream, usage=usage, shape=shape)
                assert stored_stream(key) is stream, (endpoint, stream, shape)


def test_redis_key_quotes_separators() -> None:
    assert redis_key("p", b"\x00\xff", "a:b", "m*") == "p:v2:a%3Ab:m%2A:00ff"


@given(
    payloads=st.lists(
        st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b),
        max_size=8,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    crlf=st.booleans(),
)
def test_sse_decoder_is_independent_of_chunking(
    payloads: list[bytes], cuts: list[int], crlf: bool
) -> None:
    raw = b"".join(sse.encode(p) for p in payloads)
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    points = sorted({c for c in cuts if c < len(raw)} | {0, len(raw)})
    d = sse.Decoder()
    out: list[bytes] = []
    for a, b in itertools.pairwise(points):
        out += d.feed(raw[a:b])
    # encode() writes "data: " and the decoder strips exactly that one space: a round trip.
    assert out == payloads
    assert not d.pending
