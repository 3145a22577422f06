"""Tier 2 against a real redis-server: sharing, TTL, namespaces, purge, and outage degradation."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import zlib
from collections.abc import AsyncIterator

import msgspec
import pytest

from router.cache.policy import Entry, storage_key
from router.cache.redis_tier import RedisTier, decode_entry, encode_entry, redis_key
from tests.support import Proc, free_port, redis_clients, start_redis

pytestmark = pytest.mark.redis


MAX_ENTRY = 4096
BODY_KEY = storage_key(b"\x01" * 16, endpoint="/v1/chat/completions", stream=False)
STREAM_KEY = storage_key(b"\x01" * 16, endpoint="/v1/chat/completions", stream=True)


def entry(ns: str = "t", model: str = "m", ttl: float = 60.0, body: bytes = b"{}") -> Entry:
    now = time.time()
    return Entry(
        namespace=ns,
        model=model,
        content_type="application/json",
        created=now,
        expires=now + ttl,
        body=body,
    )


@pytest.fixture
async def tier(redis_proc: Proc) -> AsyncIterator[RedisTier]:
    t = RedisTier(f"redis://127.0.0.1:{redis_proc.port}/0", timeout_s=0.5)
    yield t
    await t.close()


async def test_two_clients_share_entries(redis_proc: Proc, tier: RedisTier) -> None:
    other = RedisTier(f"redis://127.0.0.1:{redis_proc.port}/0", timeout_s=0.5)
    try:
        e = entry(body=b'{"answer": 42}')
        assert await tier.put(b"k", e)
        assert await other.get(b"k", "t", "m") == e
        assert await other.get(b"k", "other-tenant", "m") is None
    finally:
        await other.close()


async def test_ttl_is_set_on_the_redis_key(redis_proc: Proc, tier: RedisTier) -> None:
    await tier.put(b"k", entry(ttl=30))
    ttl = await tier._client.pttl(redis_key(tier.prefix, b"k", "t", "m"))
    assert 0 < ttl <= 30_000


async def test_values_are_compressed(tier: RedisTier) -> None:
    body = b'{"text": "' + b"repeat " * 2000 + b'"}'
    await tier.put(b"k", entry(body=body))
    raw = await tier._client.get(redis_key(tier.prefix, b"k", "t", "m"))
    assert isinstance(raw, bytes)
    assert len(raw) < len(body) / 10


async def test_foreign_value_under_our_key_is_a_miss(tier: RedisTier) -> None:
    await tier._client.set(redis_key(tier.prefix, b"k", "t", "m"), b"garbage")
    assert await tier.get(b"k", "t", "m") is None


async def test_purge_by_namespace_model_and_all(tier: RedisTier) -> None:
    await tier.put(b"1", entry(ns="a:b*", model="m1"))
    await tier.put(b"2", entry(ns="a", model="m1"))
    await tier.put(b"3", entry(ns="a", model="m2"))
    await tier.put(b"4", entry(ns="c", model="m2"))
    assert await tier.purge(namespace="a", model="m1") == 1
    assert await tier.get(b"1", "a:b*", "m1") is not None  # glob characters and ":" are quoted
    assert await tier.purge(model="m2") == 2
    assert await tier.purge() == 1
    assert await tier.get(b"1", "a:b*", "m1") is None


async def test_outage_degrades_warns_once_and_recovers(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    now = [0.0]
    tier = RedisTier(
        f"redis://127.0.0.1:{port}/0", timeout_s=0.5, retry_after_s=1.0, clock=lambda: now[0]
    )
    try:
        with caplog.at_level(logging.WARNING, logger="router"):
            for _ in range(5):
                assert await tier.get(b"k", "t", "m") is None
                assert not await tier.put(b"k", entry())
            assert not tier.up
            assert tier.errors == 1  # the others were skipped while backing off
            now[0] += 1.5
            assert await tier.get(b"k", "t", "m") is None
            assert tier.errors == 2
            warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
            assert len(warnings) == 1
            redis = start_redis(tmp_path_factory.mktemp("redis"), port)
            try:
                now[0] += 1.5
                assert await tier.put(b"k", entry())
                assert tier.up
                assert await tier.get(b"k", "t", "m") is not None
                assert any("recovered" in r.getMessage() for r in caplog.records)
            finally:
                redis.kill()
            now[0] += 1.5
            assert await tier.get(b"k", "t", "m") is None
            assert not tier.up
    finally:
        await tier.close()


@pytest.mark.parametrize(
    ("key", "change"),
    [
        (BODY_KEY, {"status": 500}),
        (BODY_KEY, {"status": 0}),
        (BODY_KEY, {"content_type": "application/json\r\nX-Injected: 1"}),
        (BODY_KEY, {"content_type": "json"}),
        (BODY_KEY, {"content_type": ""}),
        (BODY_KEY, {"body": b"x" * (MAX_ENTRY + 1)}),
        (BODY_KEY, {"model": "other"}),
        # A stream under a body key would be sent as SSE to a client that asked for JSON.
        (BODY_KEY, {"stream": True, "chunks": (b"{}",), "content_type": "text/event-stream"}),
        (STREAM_KEY, {}),
        (STREAM_KEY, {"stream": True, "chunks": (b"x" * 1000,) * 5}),
        # Whole events replayed joined: one cut short would run into the next.
        (STREAM_KEY, {"stream": True, "chunks": (b"data: {}\n\n", b"data: {")}),
        (STREAM_KEY, {"stream": True, "chunks": (b"",)}),
        # Data payloads (what the older format, version 1, held) are no events.
        (STREAM_KEY, {"stream": True, "chunks": (b"{}", b"{}")}),
    ],
    ids=[
        "status-500",
        "status-0",
        "crlf-content-type",
        "no-subtype",
        "empty-content-type",
        "oversized-body",
        "other-model",
        "stream-under-body-key",
        "body-under-stream-key",
        "oversized-stream",
        "event-cut-short",
        "empty-event",
        "payloads-not-events",
    ],
)
async def test_an_implausible_entry_is_a_miss(
    redis_proc: Proc, key: bytes, change: dict[str, object]
) -> None:
    # Only this router writes tier 2, and only 200s within max_entry_bytes in the key's form:
    # anything else that decodes is corrupt, and replaying it would answer garbage.
    tier = RedisTier(
        f"redis://127.0.0.1:{redis_proc.port}/0", timeout_s=0.5, max_entry_bytes=MAX_ENTRY
    )
    try:
        bad = msgspec.structs.replace(entry(), **change)
        await tier._client.set(redis_key(tier.prefix, key, "t", "m"), encode_entry(bad))
        assert await tier.get(key, "t", "m") is None
        assert tier.misses == 1
        assert tier.up
    finally:
        await tier.close()


async def test_entries_at_the_size_bound_are_hits(redis_proc: Proc) -> None:
    tier = RedisTier(
        f"redis://127.0.0.1:{redis_proc.port}/0", timeout_s=0.5, max_entry_bytes=MAX_ENTRY
    )
    try:
        body = entry(body=os.urandom(MAX_ENTRY))  # incompressible
        stream = msgspec.structs.replace(
            entry(),
            body=b"",
            chunks=(b"\n\n",) * (MAX_ENTRY // 2),
            stream=True,
            content_type="text/event-stream; charset=utf-8",
        )
        for key, e in ((BODY_KEY, body), (STREAM_KEY, stream)):
            assert await tier.put(key, e)
            assert await tier.get(key, "t", "m") == e
    finally:
        await tier.close()


async def test_a_stream_of_whole_events_is_a_hit(tier: RedisTier) -> None:
    # A stream is stored as its whole events as relayed (fields, comments, line endings).
    events = (b": hi\r\n\r\n", b"retry: 3000\r\n\r\n", b"id: 1\r\ndata: {}\r\n\r\n")
    e = msgspec.structs.replace(
        entry(), body=b"", chunks=events, stream=True, content_type="text/event-stream"
    )
    stream_key = storage_key(b"new" * 4, endpoint="/v1/chat/completions", stream=True)
    assert await tier.put(stream_key, e)
    assert await tier.get(stream_key, "t", "m") == e


def test_a_small_value_that_inflates_past_the_bound_is_not_inflated() -> None:
    # 8 MB of zeros compress to about 8 KB: inflating such a value whole stalled the loop.
    bomb = b"RC\x02" + zlib.compress(msgspec.msgpack.encode(entry(body=bytes(8 << 20))), 9)
    assert len(bomb) < 16 << 10
    assert decode_entry(bomb, MAX_ENTRY) is None
    assert decode_entry(bomb, 8 << 20) is not None


async def test_a_lookup_that_times_out_counts_as_slow(redis_proc: Proc) -> None:
    tier = RedisTier(f"redis://127.0.0.1:{redis_proc.port}/0", timeout_s=0.2)
    try:
        assert await tier.get(b"k", "t", "m") is None
        assert tier.rtt_s is not None
        assert tier.rtt_s < 0.2
        redis_proc.popen.send_signal(signal.SIGSTOP)
        try:
            assert await tier.get(b"k", "t", "m") is None
        finally:
            redis_proc.popen.send_signal(signal.SIGCONT)
        # Otherwise a frozen Redis kept its last fast estimate and stayed "near" for ever.
        assert tier.rtt_s >= 0.2
    finally:
        await tier.close()


async def test_a_stalled_redis_is_a_miss_on_a_bounded_number_of_connections(
    redis_proc: Proc,
) -> None:
    """Issue: every lookup made while Redis was stalled opened one more connection (the pool
    was unbounded). Now the lookups beyond `max_connections` wait for one and, with no answer
    in the tier's timeout, are what a lookup Redis did not answer is: a miss, the tier skipped
    for redis_retry_s, its round trip counted slow. Afterwards the tier serves from as few."""
    tier = RedisTier(
        f"redis://127.0.0.1:{redis_proc.port}/0",
        timeout_s=0.3,
        retry_after_s=0.2,
        max_connections=2,
    )
    try:
        e = entry(body=b'{"answer": 42}')
        assert await tier.put(BODY_KEY, e)
        _, accepted = redis_clients(redis_proc.port)
        redis_proc.popen.send_signal(signal.SIGSTOP)
        try:
            found = await asyncio.gather(*(tier.get(BODY_KEY, "t", "m") for _ in range(20)))
        finally:
            redis_proc.popen.send_signal(signal.SIGCONT)
        assert found == [None] * 20
        assert (tier.up, tier.errors) == (False, 20)
        assert tier.rtt_s is not None
        assert tier.rtt_s >= 0.3
        await asyncio.sleep(0.2)  # redis_retry_s
        found = await asyncio.gather(*(tier.get(BODY_KEY, "t", "m") for _ in range(20)))
        assert found == [e] * 20
        assert tier.up
        open_now, now_accepted = redis_clients(redis_proc.port)
        assert open_now <= 2
        # Each of the two may have been closed by its socket timeout and opened once more.
        assert now_accepted - (accepted + 1) <= 2 * 2
    finally:
        await tier.close()
