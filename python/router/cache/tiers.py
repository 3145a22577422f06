"""The response cache as the request path sees it: key, rules, tier 1 then tier 2, coalescing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from router.cache.coalescing import SingleFlight
from router.cache.policy import (
    Entry,
    KeyFn,
    Level,
    MemoryStore,
    Rule,
    XCache,
    resolve_rule,
    storage_key,
)
from router.cache.redis_tier import RedisTier
from router.config import CacheConfig
from router.core.request import EMBEDDINGS


class ResponseCache:
    """Tier 1 (memory), optional tier 2 (Redis), per-model rules and the single-flight registry."""

    def __init__(
        self,
        config: CacheConfig,
        key_fn: KeyFn,
        *,
        redis: RedisTier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.key_fn = key_fn
        self.redis = redis
        self.clock = clock
        self.memory = MemoryStore(config.max_bytes, clock)
        self.flights: SingleFlight[Entry] = SingleFlight()
        self._rules: dict[str, Rule] = {}
        self._writes: set[asyncio.Task[bool]] = set()
        # Asked-first lookups no longer waited for (kept referenced until they end).
        self._lookups: set[asyncio.Task[Entry | None]] = set()
        self.redis_hits = 0
        # Per model: how long the region took to start answering a miss (EWMA, seconds).
        self._answer_s: dict[str, float] = {}

    def rule(self, model: str) -> Rule:
        """The resolved rule for a client-facing model name (memoized)."""
        rule = self._rules.get(model)
        if rule is None:
            if len(self._rules) > 4096:  # model names come from clients; keep this bounded
                self._rules.clear()
            rule = self._rules[model] = resolve_rule(self.config, model)
        return rule

    def key(
        self,
        body: bytes,
        *,
        namespace: str,
        level: Level,
        endpoint: str,
        stream: bool,
        usage: bool = False,
        shape: bytes = b"",
    ) -> bytes:
        """The tier key of one request body (`shape`: what else shapes its answer). Embeddings
        key at `exact` at any level: a vector is a function of every character of its input
        (folded blank space gives another vector), not an answer to a question."""
        if endpoint == EMBEDDINGS:
            level = "exact"
        fp = self.key_fn(body, namespace, level)
        return storage_key(fp, endpoint=endpoint, stream=stream, usage=usage, shape=shape)

    async def get(self, key: bytes, namespace: str, model: str) -> Entry | None:
        """Tier 1, then tier 2 (promoted into tier 1); None on a miss."""
        entry = self.memory.get(key, namespace)
        if entry is None:
            entry = await self.shared(key, namespace, model)
        return entry

    async def shared(self, key: bytes, namespace: str, model: str) -> Entry | None:
        """Tier 2 only (a hit is promoted into tier 1); None on a miss, an outage or no tier 2."""
        if self.redis is None:
            return None
        entry = await self.redis.get(key, namespace, model)
        if entry is not None:
            self.redis_hits += 1
            self.memory.put(key, entry)
        return entry

    async def shared_first_lookup(self, key: bytes, namespace: str, model: str) -> Entry | None:
        """Tier 2 asked before the region, waited for at most `shared_lookup_first_ms`: a lookup
        still out then goes on in the background (a hit still lands in tier 1), tier 2 counts as
        slow (the next misses race it) and this miss goes to the region."""
        redis = self.redis
        if redis is None:
            return None
        began = time.perf_counter()
        bound = self.config.shared_lookup_first_ms / 1000
        lookup = asyncio.get_running_loop().create_task(self.shared(key, namespace, model))
        await asyncio.wait((lookup,), timeout=bound)
        if lookup.done():
            return lookup.result()
        # At least the bound (the loop's timer may fire a hair early): no longer asked first.
        redis.slow(max(time.perf_counter() - began, bound))
        self._lookups.add(lookup)
        lookup.add_done_callback(self._ended)
        return None

    def _ended(self, lookup: asyncio.Task[Entry | None]) -> None:
        self._lookups.discard(lookup)
        if not lookup.cancelled():
            lookup.exception()  # RedisTier.get swallows Redis failures; nothing else is expected

    def answered(self, model: str, seconds: float) -> None:
        """The region started answering a miss for `model` after `seconds`."""
        answer_s = self._answer_s
        old = answer_s.get(model)
        if old is None and len(answer_s) > 4096:  # model names come from clients
            answer_s.clear()
        answer_s[model] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def shared_may_win(self, model: str) -> bool:
        """Whether a tier-2 lookup beside the region request can answer first: not when tier 2
        is measured to be slower than the region has lately been to start answering (then it
        would cost Redis work and be ignored). Unmeasured either way: yes."""
        redis = self.redis
        if redis is None:
            return False
        answer_s = self._answer_s.get(model)
        return redis.rtt_s is None or answer_s is None or redis.rtt_s < answer_s

    def shared_first(self) -> bool:
        """Whether tier 2 is near enough to ask before the region: its measured round trip is
        under `shared_lookup_first_ms`. Otherwise it is asked beside the region request."""
        redis = self.redis
        if redis is None or redis.rtt_s is None:
            return False
        return redis.rtt_s * 1000 < self.config.shared_lookup_first_ms

    def put(self, key: bytes, entry: Entry) -> None:
        """Store in tier 1 now and in tier 2 in the background (the client is not kept waiting)."""
        if not self.memory.put(key, entry) and entry.size() > self.config.max_bytes:
            return
        if self.redis is not None:
            task = asyncio.get_running_loop().create_task(self.redis.put(key, entry))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    def new_entry(
        self,
        *,
        namespace: str,
        model: str,
        rule: Rule,
        content_type: str,
        body: bytes = b"",
        chunks: tuple[bytes, ...] = (),
        stream: bool = False,
    ) -> Entry:
        """An entry created now, expiring after the rule's TTL."""
        now = self.clock()
        return Entry(
            namespace=namespace,
            model=model,
            content_type=content_type,
            created=now,
            expires=now + rule.ttl_s,
            body=body,
            chunks=chunks,
            stream=stream,
        )

    def count(self, outcome: XCache) -> None:
        """Count one request's cache outcome."""
        stats = self.memory.stats
        if outcome is XCache.HIT:
            stats.hits += 1
        elif outcome is XCache.MISS:
            stats.misses += 1
        else:
            stats.bypasses += 1

    async def purge(self, *, namespace: str | None = None, model: str | None = None) -> int:
        """Drop matching entries from both tiers; how many were dropped."""
        dropped = self.memory.purge(namespace=namespace, model=model)
        if self.redis is not None:
            await self.flush()
            dropped += await self.redis.purge(namespace=namespace, model=model)
        return dropped

    def stats(self) -> dict[str, Any]:
        """Entries, bytes, hit ratio and counters, for the admin API."""
        s = self.memory.stats
        out: dict[str, Any] = {
            "enabled": self.config.enabled,
            "entries": len(self.memory),
            "bytes": self.memory.size,
            "max_bytes": self.memory.max_bytes,
            "hits": s.hits,
            "misses": s.misses,
            "bypasses": s.bypasses,
            "hit_ratio": round(s.hit_ratio(), 4),
            "stores": s.stores,
            "evictions": s.evictions,
            "expirations": s.expirations,
            "rejected": s.rejected,
            "coalesced": self.flights.followed,
            "in_flight": len(self.flights),
        }
        if self.redis is not None:
            out["redis"] = {
                "up": self.redis.up,
                "hits": self.redis_hits,
                "errors": self.redis.errors,
                "rtt_ms": None if self.redis.rtt_s is None else round(self.redis.rtt_s * 1000, 3),
            }
        return out

    async def flush(self) -> None:
        """Wait for background tier-2 writes."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def close(self) -> None:
        """Finish background writes and lookups, and close Redis."""
        await self.flush()
        if self._lookups:
            await asyncio.gather(*self._lookups, return_exceptions=True)
        if self.redis is not None:
            await self.redis.close()


def open_cache(config: CacheConfig, key_fn: KeyFn) -> ResponseCache:
    """The cache for a config; tier 2 only when `redis_url` is set. Call inside the event loop."""
    redis = None
    if config.redis_url:
        redis = RedisTier(
            config.redis_url,
            prefix=config.redis_prefix,
            timeout_s=config.redis_timeout_s,
            retry_after_s=config.redis_retry_s,
            max_connections=config.redis_max_connections,
            max_entry_bytes=config.max_entry_bytes,
            cluster=config.redis_cluster,
        )
    return ResponseCache(config, key_fn, redis=redis)
