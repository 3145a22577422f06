"""ResponseCache with an injected key function: rules, keys, tier 1, purge, stats (no sockets)."""

from __future__ import annotations

import hashlib

import pytest

from router.cache import Level, Rule, XCache
from router.cache_http import knobs
from router.cache_tiers import ResponseCache
from router.config import CacheConfig, CacheModelConfig


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


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"m"}', {"temperature": None, "n": None, "tools": None, "functions": None}),
        (
            b'{"temperature":0.2,"n":1,"tools":[{"type":"function"}],"messages":[]}',
            {"temperature": 0.2, "n": 1, "tools": [{"type": "function"}], "functions": None},
        ),
    ],
)
def test_knobs_reads_only_the_policy_fields(body: bytes, expected: dict[str, object]) -> None:
    assert knobs(body) == expected


def test_rule_default_is_conservative() -> None:
    assert make().rule("m") == Rule()
