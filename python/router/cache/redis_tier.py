"""Response cache, tier 2: Redis shared by router instances; an outage only means tier 1 alone."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import zlib
from collections.abc import Callable
from urllib.parse import quote

import msgspec

from router.cache.policy import Entry, stored_stream
from router.net import sse
from router.net.redis_client import MAX_CONNECTIONS, OUTAGE, TIMEOUTS, open_redis, refresh

log = logging.getLogger("router")

MAGIC = b"RC"
# 2: a stream's chunks are its whole events as relayed (1 held a chat stream's data payloads;
# a router of either version never reads the other's keys or envelopes).
VERSION = 2
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Entry)


def encode_entry(entry: Entry) -> bytes:
    """Versioned envelope: magic, version byte, zlib-compressed msgpack of the entry."""
    return MAGIC + bytes([VERSION]) + zlib.compress(_encoder.encode(entry), 1)


def decode_entry(blob: bytes, max_bytes: int) -> Entry | None:
    """The entry in an envelope; None for a foreign, newer or corrupt value (treated as a miss),
    or one that inflates past what an entry of `max_bytes` can take (a small value may inflate
    a thousandfold: decompressing it whole would stall the event loop)."""
    if len(blob) < 3 or blob[:2] != MAGIC or blob[2] != VERSION:
        return None
    # The payload is at most max_bytes; msgpack adds two bytes to a short chunk (a whole event:
    # two bytes at least), so at most doubles it, and the names are short.
    cap = 2 * max_bytes + 65536
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(blob[3:], cap)
        if inflate.unconsumed_tail or inflate.unused_data or not inflate.eof:
            return None
        return _decoder.decode(raw)
    except (zlib.error, msgspec.DecodeError, msgspec.ValidationError):
        return None


# A media type (type/subtype, parameters): visible ASCII only, so no header can be split.
_MEDIA_TYPE = re.compile(
    r"[!#$%&'*+.^_`|~0-9A-Za-z-]+/[!#$%&'*+.^_`|~0-9A-Za-z-]+(?:[ \t]*;[ -~\t]*)?"
)


def plausible(entry: Entry, *, namespace: str, model: str, stream: bool, max_bytes: int) -> bool:
    """Whether a decoded entry is one this router could have stored under the key asked for:
    a 200 in the key's form (stream or body), a sane content type, within `max_bytes`, a
    stream's events each whole. Anything else in Redis is corrupt or foreign, and replaying it
    would answer garbage."""
    size = len(entry.body) + sum(len(c) for c in entry.chunks)
    return (
        entry.namespace == namespace
        and entry.model == model
        and entry.status == 200
        and entry.stream == stream
        and size <= max_bytes
        and _MEDIA_TYPE.fullmatch(entry.content_type) is not None
        and all(map(sse.whole_event, entry.chunks))
    )


def redis_key(prefix: str, key: bytes, namespace: str, model: str) -> str:
    """`prefix:v<VERSION>:<namespace>:<model>:<hex>`; quoting keeps `:` and globs out of parts."""
    return f"{prefix}:v{VERSION}:{quote(namespace, safe='')}:{quote(model, safe='')}:{key.hex()}"


class RedisTier:
    """Get/put/purge against Redis with short timeouts; failures are swallowed and back off."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "router:cache",
        timeout_s: float = 1.0,
        retry_after_s: float = 1.0,
        max_entry_bytes: int = 1 << 20,
        max_connections: int = MAX_CONNECTIONS,
        cluster: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.max_entry_bytes = max_entry_bytes
        self._clock = clock
        self._wall = wall
        self._client = open_redis(
            url, timeout_s=timeout_s, max_connections=max_connections, cluster=cluster
        )
        # Round trip of the last lookups (EWMA, seconds; raised by one that timed out); None
        # until one answered.
        self.rtt_s: float | None = None
        self._down_until = 0.0
        self._refresh: asyncio.Task[None] | None = None
        self.up = True
        self.hits = 0
        self.misses = 0
        self.errors = 0

    async def get(self, key: bytes, namespace: str, model: str) -> Entry | None:
        """The shared entry, or None on a miss, a bad or implausible value, an expired entry or
        an outage."""
        if not self._available():
            return None
        began = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                blob = await self._client.get(redis_key(self.prefix, key, namespace, model))
        except OUTAGE as exc:
            if isinstance(exc, TIMEOUTS):
                self.slow(time.perf_counter() - began)
            self._failed(exc)
            return None
        self._measured(time.perf_counter() - began)
        self._ok()
        entry = decode_entry(blob, self.max_entry_bytes) if isinstance(blob, bytes) else None
        if (
            entry is None
            or entry.expires <= self._wall()
            or not plausible(
                entry,
                namespace=namespace,
                model=model,
                stream=stored_stream(key),
                max_bytes=self.max_entry_bytes,
            )
        ):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    async def put(self, key: bytes, entry: Entry) -> bool:
        """Store with the entry's remaining TTL; False when skipped or Redis failed."""
        ttl_ms = int((entry.expires - self._wall()) * 1000)
        if ttl_ms <= 0 or not self._available():
            return False
        name = redis_key(self.prefix, key, entry.namespace, entry.model)
        began = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._client.set(name, encode_entry(entry), px=ttl_ms)
        except OUTAGE as exc:
            self._failed(exc)
            return False
        self._measured(time.perf_counter() - began)
        self._ok()
        return True

    async def purge(self, *, namespace: str | None = None, model: str | None = None) -> int:
        """Delete matching shared entries (none given: all); the number deleted, 0 on an outage."""
        ns = quote(namespace, safe="") if namespace is not None else "*"
        mo = quote(model, safe="") if model is not None else "*"
        pattern = f"{self.prefix}:v{VERSION}:{ns}:{mo}:*"
        deleted = 0
        try:
            # Purge is an admin action, so it gets a longer budget than the request path.
            async with asyncio.timeout(max(5.0, self.timeout_s)):
                batch: list[bytes] = []
                async for name in self._client.scan_iter(match=pattern, count=500):
                    batch.append(name)
                    if len(batch) >= 500:
                        deleted += int(await self._client.unlink(*batch))
                        batch = []
                if batch:
                    deleted += int(await self._client.unlink(*batch))
        except OUTAGE as exc:
            self._failed(exc)
            return deleted
        self._ok()
        return deleted

    async def close(self) -> None:
        """Close the connection pool."""
        if self._refresh is not None:
            await self._refresh
        await self._client.aclose()

    def slow(self, seconds: float) -> None:
        """A lookup had no answer after `seconds`: the round trip is at least that for now (the
        next answers bring the estimate back down)."""
        self.rtt_s = max(self.rtt_s or 0.0, seconds)

    def _measured(self, took: float) -> None:
        self.rtt_s = took if self.rtt_s is None else 0.8 * self.rtt_s + 0.2 * took

    def _available(self) -> bool:
        return self.up or self._clock() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self._down_until = self._clock() + self.retry_after_s
        if self._refresh is None or self._refresh.done():
            # In a Cluster, find a promoted replica before the next try (no-op otherwise).
            self._refresh = asyncio.get_running_loop().create_task(refresh(self._client))
        if self.up:
            self.up = False
            log.warning("cache: redis tier unavailable, serving from memory only: %r", exc)

    def _ok(self) -> None:
        if not self.up:
            self.up = True
            log.warning("cache: redis tier recovered")
