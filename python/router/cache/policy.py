"""Response cache, tier 1: in-process store bounded by bytes (LRU) with TTL, plus the policy."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec

from router.core.sampling import sampled_anyway
from router.core.stream import payload_of
from router.net import sse

if TYPE_CHECKING:
    from router.config import CacheConfig

T = TypeVar("T")

Level = Literal["exact", "normalized"]
KeyFn = Callable[[bytes, str, Level], bytes]
"""(body, namespace, level) -> fingerprint; `router.native.fingerprint` in production."""

# Rough per-entry bookkeeping (dict slot, Entry object, tuple) so tiny entries still cost something.
ENTRY_OVERHEAD = 256
CHUNK_OVERHEAD = 56
CLEAN_FINISH = frozenset({"stop", "length"})


class XCache(StrEnum):
    """Values of the `x-cache` response header."""

    HIT = "HIT"
    MISS = "MISS"
    BYPASS = "BYPASS"


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """A response as the upstream produced it: a body, or the SSE events of a stream (`chunks`:
    whole events, byte for byte as the live relay sent them)."""

    namespace: str
    # The upstream model that answered (the key is the body the region got): an alias's and
    # its model's requests share entries, and a purge by either name finds them.
    model: str
    content_type: str
    created: float
    expires: float
    body: bytes = b""
    chunks: tuple[bytes, ...] = ()
    stream: bool = False
    # Only 200s are stored; another status travels only from a coalesced leader to followers,
    # with the answer's other headers (a refusal's Retry-After, say).
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()

    def size(self) -> int:
        """Approximate bytes this entry holds in memory."""
        return (
            ENTRY_OVERHEAD
            + len(self.body)
            + sum(len(c) + CHUNK_OVERHEAD for c in self.chunks)
            + len(self.namespace)
            + len(self.model)
            + len(self.content_type)
            + sum(len(k) + len(v) for k, v in self.headers)
        )

    def age(self, now: float) -> int:
        """Whole seconds since the origin produced it (the `Age` header)."""
        return max(0, int(now - self.created))


@dataclass(slots=True)
class Stats:
    """Counters since start (or the last reset)."""

    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    stores: int = 0
    evictions: int = 0
    expirations: int = 0
    rejected: int = 0

    def hit_ratio(self) -> float:
        """Hits over lookups (hits + misses); bypasses are not lookups."""
        looked = self.hits + self.misses
        return self.hits / looked if looked else 0.0


@dataclass(slots=True)
class MemoryStore:
    """Tier 1: entries bounded by total bytes, least recently used evicted first, TTL on read."""

    max_bytes: int
    clock: Callable[[], float] = time.time
    _entries: OrderedDict[bytes, Entry] = field(default_factory=OrderedDict)
    _bytes: int = 0
    stats: Stats = field(default_factory=Stats)

    @property
    def size(self) -> int:
        """Approximate bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, namespace: str) -> Entry | None:
        """The live entry for `key` in `namespace`, marked most recently used; None otherwise."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self._drop(key, entry)
            self.stats.expirations += 1
            return None
        # The key already carries the namespace; checking again means a key bug cannot leak.
        if entry.namespace != namespace:
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes, entry: Entry) -> bool:
        """Store `entry`, evicting least recently used ones; False if it alone exceeds the bound."""
        size = entry.size()
        if size > self.max_bytes or entry.expires <= self.clock():
            self.stats.rejected += 1
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size()
        self._entries[key] = entry
        self._bytes += size
        self.stats.stores += 1
        while self._bytes > self.max_bytes:
            _, victim = self._entries.popitem(last=False)
            self._bytes -= victim.size()
            self.stats.evictions += 1
        return True

    def purge(self, *, namespace: str | None = None, model: str | None = None) -> int:
        """Drop entries matching every given filter (none given: all); the number dropped."""
        doomed = [
            k
            for k, e in self._entries.items()
            if (namespace is None or e.namespace == namespace)
            and (model is None or e.model == model)
        ]
        for k in doomed:
            self._drop(k, self._entries[k])
        return len(doomed)

    def _drop(self, key: bytes, entry: Entry) -> None:
        del self._entries[key]
        self._bytes -= entry.size()


def _matches(entry: Entry, namespace: str | None, model: str | None) -> bool:
    return (namespace is None or entry.namespace == namespace) and (
        model is None or entry.model == model
    )


class CacheControl(msgspec.Struct, frozen=True):
    """The request's `Cache-Control` directives the cache honours."""

    no_cache: bool = False
    no_store: bool = False


def parse_cache_control(value: str | None) -> CacheControl:
    """Parse a request `Cache-Control` header; unknown directives are ignored."""
    if not value:
        return CacheControl()
    directives = {d.split("=", 1)[0].strip().lower() for d in value.split(",")}
    return CacheControl(no_cache="no-cache" in directives, no_store="no-store" in directives)


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    """Resolved cacheability rule for one model (the global defaults with its overrides)."""

    enabled: bool = True
    level: Level = "exact"
    ttl_s: float = 300.0
    max_temperature: float = 0.0
    cache_unset_temperature: bool = False
    allow_tools: bool = False


class Decision(msgspec.Struct, frozen=True):
    """What the cache does for one request."""

    lookup: bool
    store: bool
    reason: str = ""

    @property
    def bypass(self) -> bool:
        """Neither read nor written."""
        return not self.lookup and not self.store


def resolve_rule(config: CacheConfig, model: str) -> Rule:
    """The [cache] defaults overlaid with [cache.models.<model>]."""
    o = config.models.get(model)

    def pick(override: T | None, default: T) -> T:
        return default if override is None else override

    if o is None:
        return Rule(
            enabled=config.enabled,
            level=config.level,
            ttl_s=config.ttl_s,
            max_temperature=config.max_temperature,
            cache_unset_temperature=config.cache_unset_temperature,
            allow_tools=config.allow_tools,
        )
    return Rule(
        enabled=config.enabled and pick(o.enabled, True),
        level=pick(o.level, config.level),
        ttl_s=pick(o.ttl_s, config.ttl_s),
        max_temperature=pick(o.max_temperature, config.max_temperature),
        cache_unset_temperature=pick(o.cache_unset_temperature, config.cache_unset_temperature),
        allow_tools=pick(o.allow_tools, config.allow_tools),
    )


def decide(
    request: Mapping[str, Any], rule: Rule, control: CacheControl, *, sampled: bool = True
) -> Decision:
    """Whether to read/write the cache for this decoded request body; pure.

    `sampled` is False for endpoints with no sampling (embeddings): temperature does not apply.
    """
    reason = _uncacheable(request, rule, sampled)
    if reason:
        return Decision(False, False, reason)
    return Decision(not control.no_cache, not control.no_store, "")


def _temperature(temperature: Any, rule: Rule) -> str:
    if temperature is None:
        return "" if rule.cache_unset_temperature else "temperature unset"
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        return "temperature"
    return "temperature" if temperature > rule.max_temperature else ""


def _uncacheable(request: Mapping[str, Any], rule: Rule, sampled: bool) -> str:
    if not rule.enabled:
        return "disabled"
    if sampled:
        reason = _temperature(request.get("temperature"), rule)
        if reason:
            return reason
        if sampled_anyway(
            request.get("dynatemp_range"),
            request.get("samplers"),
            request.get("xtc_probability"),
            request.get("xtc_threshold"),
        ):
            return "temperature"
    # llama.cpp's server reads its own `n_cmpl` before `n`.
    for choices in (request.get("n"), request.get("n_cmpl")):
        if choices is not None and choices != 1:
            return "n"
    if not rule.allow_tools and (
        request.get("tools")
        or request.get("functions")
        or request.get("mcp_servers")
        # An empty object turns the search on.
        or request.get("web_search_options") is not None
    ):
        return "tools"
    return ""


# How a typed-event stream, or a whole answer of those APIs, ends when it is worth storing.
_CLEAN_STATUS = frozenset({"completed", "incomplete"})
_CLEAN_STOP = frozenset({"end_turn", "max_tokens", "stop_sequence"})
_CLEAN_END = frozenset({"response.completed", "response.incomplete", "message_stop"})
_FAILED_EVENTS = frozenset({"error", "response.failed"})


def complete_body(body: bytes) -> bool:
    """A non-stream response worth storing: JSON whose choices all ended stop/length (a
    Responses API answer completed, a Messages answer stopped by its turn, limit or stop)."""
    try:
        doc = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return False
    if not isinstance(doc, dict) or doc.get("error") is not None:
        return False
    if doc.get("object") == "response":
        return doc.get("status") in _CLEAN_STATUS
    if doc.get("type") == "message":
        return doc.get("stop_reason") in _CLEAN_STOP
    choices = doc.get("choices")
    if choices is None:
        return "data" in doc  # embeddings: no finish_reason to check
    return (
        isinstance(choices, list)
        and bool(choices)
        and all(isinstance(c, dict) and c.get("finish_reason") in CLEAN_FINISH for c in choices)
    )


def storage_key(
    fingerprint: bytes, *, endpoint: str, stream: bool, usage: bool = False, shape: bytes = b""
) -> bytes:
    """Tier key: the fingerprint plus what shapes the stored form (endpoint, stream, usage chunk)
    and, when there is any, a digest of `shape`: what else shapes the answer (headers, fields).

    The fingerprint leaves out transport fields (`stream`, `stream_options`), yet a body and a
    stream are stored differently, and only a stream asked with include_usage has a usage chunk.
    """
    form = (b"|SU" if usage else b"|S") if stream else b"|B"
    key = fingerprint + b"|" + endpoint.encode()
    if shape:
        key += b"|" + hashlib.blake2b(shape, digest_size=16).digest()
    # The form last, where `stored_stream` reads it.
    return key + form


def stored_stream(key: bytes) -> bool:
    """Whether a tier key made by `storage_key` holds a stream (its form says so)."""
    return key.endswith((b"|S", b"|SU"))


class StreamRecorder:
    """The miss-path tee: records a stream's whole SSE events byte for byte as relayed (their
    `event:`, `id:` and `retry:` lines, comments and line endings included), so a hit replays
    what the live relay sent; `complete` only after a clean finish (`typed`: a typed-event
    API's, Responses or Messages, read from its terminal event)."""

    __slots__ = ("_done", "_failed", "_finishes", "_tail", "chunks", "typed")

    def __init__(self, typed: bool = False) -> None:
        self.chunks: list[bytes] = []
        # The start of an event the bytes so far did not end (the relay sends whole events;
        # another writer may cut them anywhere).
        self._tail = b""
        self._finishes: dict[int, str | None] = {}
        self._done = False
        self._failed = False
        self.typed = typed

    def feed(self, raw: bytes) -> list[bytes]:
        """Record the raw bytes forwarded to the client; the events they completed, as sent."""
        data = self._tail + raw if self._tail else raw
        events = sse.events_of(data)
        # A CR after an LF last may be the first half of a CR LF (the event's end is then
        # its LF, as the relay's Splitter reads it): it waits for the next bytes.
        cut = bool(events) and (not sse.whole_event(events[-1]) or data.endswith(b"\n\r"))
        self._tail = events.pop() if cut else b""
        if self._failed:
            return events
        for event in events:
            self._add(event, payload_of(event))
        return events

    def close(self) -> list[bytes]:
        """At the stream's end: an event held back for a CR LF that never came (it ended with
        LF then CR, a whole event as the relay read it), recorded now; the events that were."""
        tail, self._tail = self._tail, b""
        if not tail or not sse.whole_event(tail):
            self._tail = tail  # cut inside an event: never complete
            return []
        self._add(tail, payload_of(tail))
        return [tail]

    def _add(self, event: bytes, payload: bytes | None) -> None:
        """Record one whole event and its data payload (None: it has none)."""
        if self._failed:
            return
        self.chunks.append(event)
        if payload is None:
            return  # a comment, `retry:` or an `id:` alone: replayed as sent, nothing to read
        if self._done:
            self._failed = True  # data after the end is not a stream we understand
            return
        if self.typed:
            self._typed(payload)
        else:
            self._chunk(payload)

    def _chunk(self, payload: bytes) -> None:
        """Note one data payload of a chat or completions stream."""
        if payload == sse.DONE:
            self._done = True
            return
        try:
            doc = msgspec.json.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            self._failed = True
            return
        if not isinstance(doc, dict) or "error" in doc:
            self._failed = True
            return
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict):
                index = choice.get("index", 0)
                reason = choice.get("finish_reason")
                if reason is not None or index not in self._finishes:
                    self._finishes[index] = reason

    def _typed(self, payload: bytes) -> None:
        """Note one data payload of a typed-event stream."""
        try:
            doc = msgspec.json.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            self._failed = True
            return
        kind = doc.get("type") if isinstance(doc, dict) else None
        if kind in _FAILED_EVENTS or not isinstance(doc, dict):
            self._failed = True
        elif kind in _CLEAN_END:
            self._done = True

    def fail(self) -> None:
        """The stream broke (upstream error, abort): it must never be stored."""
        self._failed = True

    @property
    def complete(self) -> bool:
        """Ended with [DONE] and every choice finished with stop or length (`typed`: ended
        with a clean terminal event)."""
        if self._tail:
            return False  # it ended inside an event
        if self.typed:
            return self._done and not self._failed
        return (
            self._done
            and not self._failed
            and bool(self._finishes)
            and all(r in CLEAN_FINISH for r in self._finishes.values())
        )
