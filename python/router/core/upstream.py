"""Upstream regions at runtime: one keep-alive connection pool per region, and header filtering."""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from urllib.parse import urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

from router.config import Config, RegionConfig
from router.core.request import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    EMBEDDINGS,
    INPUT_TOKENS,
    MESSAGES,
    RESPONSES,
)
from router.core.timing import CONNECT, StageTimer
from router.core.transport import Transport, UpstreamResponse
from router.net import http1

log = logging.getLogger("router")

# Hop-by-hop headers (RFC 9110 §7.6.1) plus the ones the router itself owns on each leg.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)
# Client credentials are for the router, never for a region; the region key replaces them.
# The body forwarded is the one aiohttp decoded, so no content-encoding describes it; the
# router asks for identity bytes itself. Client-supplied forwarding headers are spoofable and
# name the client to the provider: neither is passed on, and the router adds none.
REQUEST_DROP = _HOP | {
    "authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "content-encoding",
    "accept-encoding",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "x-request-id",
}
# Region response headers never relayed. aiohttp's web server sets its own Date/Server;
# content-length is recomputed from the body. A region's cookies and CORS policy are not the
# router's to hand out.
_RESPONSE_DROP = _HOP | {
    "date",
    "server",
    "set-cookie",
    "set-cookie2",
    # Who the operator is at the provider (its organization, project).
    "openai-organization",
    "openai-project",
    "anthropic-organization-id",
    # The router answers these itself: its request id, its cache's age and result, its timings.
    "x-request-id",
    "age",
    "x-cache",
    "server-timing",
    # Policies, credentials challenges and reporting for the router's whole origin, and
    # navigation away from it: a region may not set them for the router's host.
    "strict-transport-security",
    "alt-svc",
    "clear-site-data",
    "expect-ct",
    "public-key-pins",
    "public-key-pins-report-only",
    "nel",
    "report-to",
    "reporting-endpoints",
    "www-authenticate",
    "authentication-info",
    "proxy-authentication-info",
    "location",
    "content-location",
    "refresh",
    # The region's software and the hops behind it (as Server).
    "via",
    "x-powered-by",
    # Caching and validation: an answer is one tenant's, never for a shared cache to keep or
    # serve to another (the router sends `Cache-Control: no-store` on every proxied answer);
    # the CDN-targeted forms (RFC 9213, Surrogate-Control, nginx's X-Accel-Expires) override
    # Cache-Control where they are honoured.
    "cache-control",
    "cdn-cache-control",
    "surrogate-control",
    "x-accel-expires",
    "expires",
    "pragma",
    "etag",
    "last-modified",
    "vary",
}
# CORS grants; the router's own namespace; the provider account's rate limits (OpenAI's,
# the IETF draft's, Anthropic's), which are not a tenant's: the router sets x-ratelimit-* for
# the keys it limits.
_RESPONSE_DROP_PREFIXES = (
    "access-control-",
    "x-router-",
    "x-ratelimit",
    "ratelimit",
    "anthropic-ratelimit-",
)
# Servers that honour stream_options.include_usage (llama-cpp-python ignores it).
_REPORTS_USAGE = frozenset({"vllm", "llama-server", "openai", "sim"})
# Request ids the router sends upstream are UUIDs (llama-cpp-python refuses anything else).
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
_IDS = uuid.UUID("6f1a4e0e-8c1b-4c61-9d0e-2b5f1c3a7d40")
# `[[regions]] endpoints` names -> the router paths they stand for.
PATHS = {
    "chat": CHAT,
    "completions": COMPLETIONS,
    "embeddings": EMBEDDINGS,
    "responses": RESPONSES,
    "messages": MESSAGES,
    "input_tokens": INPUT_TOKENS,
    "count_tokens": COUNT_TOKENS,
}


def upstream_id(request_id: str) -> str:
    """The request id as a UUID: itself when it is one, else one derived from it (stable)."""
    if len(request_id) == 36 and _UUID.match(request_id):
        return request_id
    return str(uuid.uuid5(_IDS, request_id))


# The stage timer of the request whose task is running: the pool's connect hook runs in that
# task but is handed only the pool. The driver sets it per request.
CURRENT: ContextVar[StageTimer | None] = ContextVar("router.current", default=None)


def record_connect(ns: int) -> None:
    """Add a new upstream connection's time (TCP + TLS) to the running request's `connect` stage.

    A reused keep-alive connection costs nothing and records nothing.
    """
    timer = CURRENT.get()
    if timer is not None:
        timer.record(CONNECT, ns)


class Upstream:
    """One region: its config, the credentials sent to it, and its connection pool."""

    __slots__ = (
        "_base_path",
        "_escaped",
        "_key",
        "_secret",
        "auth",
        "base",
        "config",
        "endpoints",
        "id_header",
        "name",
        "pool",
        "reports_usage",
    )

    def __init__(self, config: RegionConfig, pool: Transport, api_key: str | None):
        self.config = config
        self.name = config.name
        self.base = config.base_url.rstrip("/")
        self._base_path = urlsplit(self.base).path
        self.pool = pool
        self.auth = f"Bearer {api_key}" if api_key else None
        self._secret = api_key.encode() if api_key else None
        self._key = api_key or None
        self._escaped = _escaped_forms(api_key) if api_key else None
        self.id_header = config.request_id_header
        # Whether its server sends a usage chunk when a stream asks for one.
        self.reports_usage = config.kind in _REPORTS_USAGE
        # The router paths it serves.
        self.endpoints = frozenset(PATHS[name] for name in config.served_endpoints())

    def path(self, endpoint: str) -> str:
        """The region's request path for a router path such as /v1/chat/completions."""
        # Regions are configured like OpenAI's base_url (ending in /v1) or as bare hosts.
        base = self._base_path
        if base.endswith("/v1") and endpoint.startswith("/v1/"):
            return base + endpoint[3:]
        return base + endpoint

    def request_headers(self, client: Mapping[str, str], request_id: str) -> CIMultiDict[str]:
        """Client headers minus hop-by-hop and client credentials, plus the region key and id."""
        # Headers the client's Connection header names are hop-by-hop too (RFC 9110 7.6.1).
        named = client.get("Connection")
        hop = {h.strip().lower() for h in named.split(",")} if named else ()
        out: CIMultiDict[str] = CIMultiDict(
            [
                (key, value)
                for key, value in client.items()
                if (low := key.lower()) not in REQUEST_DROP and low not in hop
            ]
        )
        if self.auth is not None:
            out["Authorization"] = self.auth
        out["Accept-Encoding"] = "identity"
        if self.id_header:
            out[self.id_header] = upstream_id(request_id)
        return out

    @property
    def has_secret(self) -> bool:
        """Whether the region has a key of the router's to keep from clients."""
        return self._secret is not None

    def scrub(self, body: bytes) -> bytes:
        """Bytes of the region's (a whole body, whole stream events) with its own API key
        blanked, as written or JSON-escaped (`\\/`, `\\u002d`, ...): a region may echo our
        headers."""
        secret = self._secret
        if secret is None:
            return body
        if secret in body:
            body = body.replace(secret, b"***")
        if self._escaped is not None and (b"\\u" in body or b"\\/" in body):
            body = self._escaped.sub(b"***", body)
        return body

    def response_headers(self, upstream: CIMultiDictProxy[str]) -> CIMultiDict[str]:
        """`response_headers`, less any header whose value holds the region's key, or whose
        name does in any case (a proxy on the way may have lowered it)."""
        out = response_headers(upstream)
        key = self._key
        if key is not None:
            folded = key.lower()
            # One look at all names and values at once; only a hit looks at each of them.
            if key in "\n".join(out.values()) or folded in "\n".join(out.keys()).lower():
                for name in [
                    name for name, value in out.items() if key in value or folded in name.lower()
                ]:
                    out.popall(name, None)
        return out


def _escaped_forms(key: str) -> re.Pattern[bytes]:
    """Every JSON spelling of `key`: each character as itself or as a \\uXXXX escape (either
    case), `/` also as `\\/`."""
    parts = []
    for char in key:
        forms = [re.escape(char.encode()), rb"\\u(?i:" + f"{ord(char):04x}".encode() + b")"]
        if char == "/":
            forms.append(rb"\\/")
        parts.append(b"(?:" + b"|".join(forms) + b")")
    return re.compile(b"".join(parts))


class Opened:
    """An attempt that got a usable answer: a whole body, or a stream and its first chunk."""

    __slots__ = ("body", "first", "headers", "response", "status", "upstream", "usage_added")

    def __init__(
        self,
        upstream: Upstream,
        status: int,
        headers: CIMultiDict[str],
        *,
        body: bytes | None = None,
        response: UpstreamResponse | None = None,
        first: bytes = b"",
    ) -> None:
        self.upstream = upstream
        self.status = status
        self.headers = headers
        # Non-stream (or any non-200 answer): the whole body, byte-exact.
        self.body = body
        # Stream: the live upstream response, its first chunk already read.
        self.response = response
        self.first = first
        # The router added include_usage to the stream's request (its usage chunk is ours).
        self.usage_added = False


def response_headers(upstream: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Upstream response headers safe to relay to the client (net.http1 gives each value as
    the UTF-8 text the region sent, which aiohttp writes back as the same bytes)."""
    drop = _RESPONSE_DROP
    if "Connection" in upstream:
        # Headers the region's Connection header names are hop-by-hop too (RFC 9110 7.6.1).
        named = ",".join(upstream.getall("Connection")).split(",")
        drop = drop | {token.strip().lower() for token in named}
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in upstream.items():
        low = key.lower()
        if low not in drop and not low.startswith(_RESPONSE_DROP_PREFIXES):
            out.add(key, value)
    return out


class Upstreams:
    """Every configured region, by name and in config order."""

    def __init__(self, regions: Iterable[Upstream]):
        self._all = tuple(regions)
        self._by_name = {u.name: u for u in self._all}
        self._by_model: dict[str, tuple[Upstream, ...]] = {}
        # Static preference (sorted() is stable, so config order breaks ties).
        self._served: set[tuple[str, str]] = set()
        for u in sorted(self._all, key=lambda u: (u.config.bias_ms, -u.config.weight)):
            for model in u.config.models:
                self._by_model[model] = (*self._by_model.get(model, ()), u)
                self._served.update((model, path) for path in u.endpoints)
        # Paths some region does not serve: only their candidates need filtering.
        self._partial = frozenset(
            p for p in PATHS.values() if any(p not in u.endpoints for u in self._all)
        )

    def __iter__(self) -> Iterator[Upstream]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def get(self, name: str) -> Upstream | None:
        """The region called `name`, if configured."""
        return self._by_name.get(name)

    def serving(self, model: str) -> tuple[Upstream, ...]:
        """Regions serving the upstream model `model`: lowest bias_ms, then highest weight."""
        return self._by_model.get(model, ())

    def serves(self, model: str, endpoint: str) -> bool:
        """Whether some region serves `model` on the router path `endpoint`."""
        return (model, endpoint) in self._served

    def on(self, endpoint: str, candidates: Sequence[Upstream]) -> Sequence[Upstream]:
        """The candidates that serve `endpoint`, in order."""
        if endpoint not in self._partial:
            return candidates
        return [u for u in candidates if endpoint in u.endpoints]

    async def close(self) -> None:
        """Close every pool."""
        for u in self._all:
            await u.pool.close()


def open_upstreams(config: Config) -> Upstreams:
    """A connection pool per region; must run inside the event loop that will use them."""
    regions = []
    for region in config.regions:
        api_key = None
        if region.api_key_env:
            api_key = os.environ.get(region.api_key_env)
            if api_key is None:
                log.warning(
                    "region %s: env var %s is not set; sending no API key",
                    region.name,
                    region.api_key_env,
                )
        # Bodies are relayed as the region sent them, and no header the client did not send is
        # added; new-connection time goes to the request's `connect` stage (Server-Timing).
        pool = http1.Pool(
            region.base_url,
            limit=region.max_connections,
            keepalive_s=region.keepalive_s,
            connect_timeout=config.timeouts.connect,
            total_timeout=config.timeouts.total,
            on_connect=record_connect,
            max_head_bytes=config.server.max_response_head_bytes,
            max_headers=config.server.max_headers,
        )
        regions.append(Upstream(region, pool, api_key))
    return Upstreams(regions)
