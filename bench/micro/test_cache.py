"""Per-request cost of the cache's hit path without HTTP: policy, fingerprint, tier-1 lookup."""

from __future__ import annotations

import msgspec
from pytest_benchmark.fixture import BenchmarkFixture

from router.cache.policy import CacheControl, MemoryStore, StreamRecorder, decide, storage_key
from router.cache.serving import knobs, native_key_fn
from router.cache.tiers import ResponseCache
from router.config import CacheConfig
from router.net import sse

BODY = msgspec.json.encode(
    {
        "model": "sim-1",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "How do I reset my password on the web app?"},
        ],
    }
)


def filled() -> tuple[ResponseCache, bytes]:
    cache = ResponseCache(CacheConfig(enabled=True, max_temperature=0.0), native_key_fn())
    rule = cache.rule("sim-1")
    key = cache.key(
        BODY, namespace="t", level="exact", endpoint="/v1/chat/completions", stream=False
    )
    cache.memory.put(
        key,
        cache.new_entry(namespace="t", model="sim-1", rule=rule, content_type="x", body=b"{}"),
    )
    for i in range(10_000):  # a realistically full table, not a one-entry dict
        cache.memory.put(
            i.to_bytes(16, "big"),
            cache.new_entry(namespace="t", model="sim-1", rule=rule, content_type="x", body=b"{}"),
        )
    return cache, key


def test_hit_decision_and_lookup(benchmark: BenchmarkFixture) -> None:
    cache, key = filled()
    rule = cache.rule("sim-1")
    assert cache.memory.get(key, "t") is not None

    def hit() -> bool:
        d = decide(knobs(BODY), rule, CacheControl())
        k = cache.key(
            BODY, namespace="t", level=rule.level, endpoint="/v1/chat/completions", stream=False
        )
        return d.lookup and cache.memory.get(k, "t") is not None

    assert benchmark(hit)


def test_normalized_fingerprint(benchmark: BenchmarkFixture) -> None:
    fn = native_key_fn()
    exact = storage_key(fn(BODY, "t", "normalized"), endpoint="/e", stream=False)
    assert (
        benchmark(lambda: storage_key(fn(BODY, "t", "normalized"), endpoint="/e", stream=False))
        == exact
    )


def _stream_events() -> list[bytes]:
    """A 60-chunk chat stream as relayed: whole events, the last [DONE]."""
    chunks = [
        msgspec.json.encode({"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]})
        for i in range(59)
    ]
    end = msgspec.json.encode({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return [*map(sse.encode, chunks), sse.encode(end), sse.encode_done()]


def test_stream_replay(benchmark: BenchmarkFixture) -> None:
    # A hit's stream: the stored events as relayed, joined.
    events = tuple(_stream_events())
    out = benchmark(lambda: b"".join(events))
    assert sse.split_events(out) == [e[:-2] for e in events]


def test_stream_recording(benchmark: BenchmarkFixture) -> None:
    # A miss's tee: the relayed bytes (here in three writes) cut into whole events and checked.
    events = _stream_events()
    writes = [b"".join(events[:20]), b"".join(events[20:40]), b"".join(events[40:])]

    def record() -> StreamRecorder:
        recorder = StreamRecorder()
        for data in writes:
            recorder.feed(data)
        return recorder

    recorder = benchmark(record)
    assert recorder.complete
    assert recorder.chunks == events


def test_memory_store_put_with_eviction(benchmark: BenchmarkFixture) -> None:
    store = MemoryStore(1 << 20)
    cache, _ = filled()
    entry = cache.new_entry(
        namespace="t", model="m", rule=cache.rule("m"), content_type="x", body=b"x" * 2000
    )
    counter = iter(range(10**9))
    benchmark(lambda: store.put(next(counter).to_bytes(16, "big"), entry))
    assert store.size <= 1 << 20
