"""The router's config: one TOML file decoded once into frozen msgspec Structs."""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from router import config_env, config_redis
from router.errors import ConfigError


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config section: immutable, keyword-only, unknown keys rejected."""


class TlsConfig(_Section, frozen=True):
    """[server.tls] / [server.admin_tls]: TLS on a listener; the files are read again on reload."""

    # PEM certificate chain (leaf first) and its private key.
    cert_file: str
    # PEM private key of the certificate (unencrypted; keep it readable by the router only).
    key_file: str
    # PEM CA bundle: when set, clients must present a certificate it signed (mutual TLS).
    client_ca_file: str | None = None
    # Oldest protocol accepted; TLS 1.0 and 1.1 are never offered.
    min_version: Literal["1.2", "1.3"] = "1.2"


class ServerConfig(_Section, frozen=True):
    """[server]: where the router listens and how long it waits on clients."""

    # Client listener, `host:port` (`/v1`, plus /metrics, /status* and /admin/* when admin_listen
    # is unset).
    listen: str = "127.0.0.1:8080"
    # Optional admin listener: when set, /metrics, /status* and /admin/* are served only there
    # and /v1 only on `listen` (bind it to a private interface); /healthz and /readyz on both.
    admin_listen: str | None = None
    # TLS on `listen` (unset: plain HTTP).
    tls: TlsConfig | None = None
    # TLS on `admin_listen`, optionally requiring client certificates (unset: plain HTTP).
    admin_tls: TlsConfig | None = None
    # Worker processes sharing the listeners (SO_REUSEPORT) under one supervisor; "auto": the
    # CPUs this process may run on (at most 64); 1: no supervisor. See docs/PRODUCTION.md for
    # what is shared.
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] | Literal["auto"] = 1
    # Largest request body accepted (413 above it). Whatever its size, a body nested deeper
    # than 128 arrays and objects is a 400.
    max_body_bytes: int = 1 << 20
    # Slow-loris protection: a connection must complete a request head within header_timeout_s of
    # connecting or of its previous response (aiohttp's keep-alive timer, so this is also the idle
    # keep-alive timeout), and send its body within body_timeout_s.
    header_timeout_s: float = 10.0
    # See header_timeout_s: a request body must arrive within this.
    body_timeout_s: float = 30.0
    # On SIGTERM: stop accepting, then give in-flight requests this long to finish; those
    # left end then (a stream with an error event, the others with a 503 to retry).
    drain_timeout_s: float = 10.0
    # Largest request line and single header (aiohttp answers 400 above them).
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16384
    # Most request headers (400 above it).
    max_headers: Annotated[int, msgspec.Meta(ge=8)] = 128
    # Most messages (or prompt/input items) in one request (400 above it). Whatever this is, a
    # `model` longer than 256 characters is a 400 naming `model`.
    max_messages: Annotated[int, msgspec.Meta(ge=1)] = 2048
    # Requests in flight from one client IP (0 = no cap; 429 above it).
    max_in_flight_per_ip: Annotated[int, msgspec.Meta(ge=0)] = 256
    # Largest region response body relayed; a larger one is a failed attempt (a continuation of
    # a broken stream may add at most what the broken stream left of it, else the stream ends).
    max_response_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 << 20
    # A region's response head (status line and headers) over this many bytes, or with more
    # than max_headers fields, fails the attempt like a broken answer (fail over, else 502).
    max_response_head_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 << 10
    # One SSE event of a region's stream above this ends the stream as broken (continued
    # elsewhere, or an error event), so a never-ending line costs bounded memory and CPU. A
    # stream's bytes before its first token are bounded apart: at most 4 MiB (and at most
    # max_response_bytes), else the attempt fails and another region is asked.
    max_event_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1 << 20
    # Young-generation GC threshold once started (CPython's default is 700; 0 keeps it).
    # Fewer passes over in-flight requests' objects: a third less CPU per request at c=128.
    gc_gen0_threshold: Annotated[int, msgspec.Meta(ge=0)] = 50_000


class TimeoutsConfig(_Section, frozen=True):
    """[timeouts]: upstream deadlines, in seconds."""

    # Opening a connection to a region.
    connect: float = 2.0
    # Until response headers, and for streams the first token (a role preamble or keep-alive
    # comments before it do not count). Regions usually send a non-stream answer's headers only
    # once it is complete, so this also bounds non-stream generation time: keep it above the
    # longest non-stream answer (or a stream's longest prompt processing) you expect.
    first_byte: float = 30.0
    # Longest pause between two chunks of a streamed answer; a whole answer's body must come
    # within this of its head (regions send it at once, once generated).
    idle: float = 30.0
    # A whole exchange with a region, streams included (a stream passing it ends with an error
    # event; the router's own bound, held against no region).
    total: float = 600.0


# The APIs a region may serve (`[[regions]] endpoints`).
Endpoint = Literal[
    "chat", "completions", "embeddings", "responses", "messages", "input_tokens", "count_tokens"
]


class RegionConfig(_Section, frozen=True):
    """One [[regions]] entry: an OpenAI-compatible endpoint serving some models."""

    # Unique region name, used in logs, metrics and admin calls.
    name: str
    # The region's OpenAI-compatible base URL, up to and including `/v1`.
    base_url: str
    # Model names this region serves.
    models: tuple[str, ...]
    # Environment variable holding the region's API key (sent as a bearer token); unset: none.
    api_key_env: str | None = None
    # Relative share of traffic among regions of equal score.
    weight: float = 1.0
    # Added to the region's measured latency when ranking; lower means preferred.
    bias_ms: float = 0.0
    # Most connections open to this region at once.
    max_connections: int = 256
    # Idle pooled connections are dropped after this; keep it below the region's own keep-alive
    # timeout (uvicorn, used by vLLM, closes after 5 s) so a reused connection is never stale.
    keepalive_s: float = 4.0
    # The server software: what it can do and how to probe it. vllm and llama-server continue
    # a final assistant message and report stream usage; llama-cpp-python does neither.
    kind: Literal["generic", "vllm", "llama-server", "llama-cpp-python", "openai", "sim"] = (
        "generic"
    )
    # Continuing a stream cut mid-way: "continue" (send the text so far as an assistant
    # prefill), "regenerate" (resend the request; only for deterministic requests, the new
    # text must match what the client has), "none", or "auto" (from `kind`).
    continuation: Literal["auto", "continue", "regenerate", "none"] = "auto"
    # The request id goes to the region in this header, always as a UUID (the client's id when
    # it is one; one derived from it otherwise); "" sends none.
    request_id_header: str = "X-Request-Id"
    # The route active probes ask, from the server root; unset: from `kind` (a route that does
    # not wait for the model), else [health] path with its 404 fallback.
    health_path: str | None = None
    # The APIs the region serves ("chat", "completions", "embeddings", "responses",
    # "messages", and the prompt counts "input_tokens" (/v1/responses/input_tokens) and
    # "count_tokens" (/v1/messages/count_tokens)); unset: from `kind` (generic and
    # llama-cpp-python: the first three; openai adds responses and input_tokens; vllm the first
    # five; llama-server and sim all seven).
    endpoints: tuple[Endpoint, ...] | None = None

    def probe_path(self) -> str | None:
        """The region's own probe path, if it has one (set, or known for its kind)."""
        if self.health_path is not None:
            return self.health_path
        return _PROBE_PATHS.get(self.kind)

    def served_endpoints(self) -> tuple[Endpoint, ...]:
        """The APIs it serves: `endpoints`, else those its kind serves."""
        if self.endpoints is not None:
            return self.endpoints
        return _KIND_ENDPOINTS.get(self.kind, _OPENAI_CLASSIC)


_OPENAI_CLASSIC: tuple[Endpoint, ...] = ("chat", "completions", "embeddings")
_GENERATING: tuple[Endpoint, ...] = (*_OPENAI_CLASSIC, "responses", "messages")
_ALL_ENDPOINTS: tuple[Endpoint, ...] = (*_GENERATING, "input_tokens", "count_tokens")
_KIND_ENDPOINTS: dict[str, tuple[Endpoint, ...]] = {
    "vllm": _GENERATING,
    "llama-server": _ALL_ENDPOINTS,
    "sim": _ALL_ENDPOINTS,
    "openai": (*_OPENAI_CLASSIC, "responses", "input_tokens"),
}


# Health routes that answer without waiting for the model (a busy server must not look dead,
# and llama-cpp-python's /v1/models waits for the model lock, then can interrupt a stream).
_PROBE_PATHS = {
    "vllm": "/health",
    "llama-server": "/health",
    "llama-cpp-python": "/docs",
    "sim": "/health",
}

FallbackOn = Literal[
    "unavailable", "overloaded", "server_error", "timeout", "context_length", "unsupported"
]


class ModelsConfig(_Section, frozen=True):
    """[models]: client-facing aliases -> the model name regions serve; model fallbacks."""

    # Alias -> served model name; clients may send either.
    aliases: dict[str, str] = msgspec.field(default_factory=dict)
    # Per client-facing model, the models to try in order when no region could answer it
    # (each with its own regions). Never on an error the request caused, except too long a
    # prompt when "context_length" is listed (a larger-context model can take it), and an
    # input no region of the model can take when "unsupported" is (images to a text model).
    fallbacks: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    # The failures that move a request on to the next model of its fallback chain.
    fallback_on: tuple[FallbackOn, ...] = (
        "unavailable",
        "overloaded",
        "server_error",
        "timeout",
        "context_length",
        "unsupported",
    )


_SHA256_HEX = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
_POSITIVE = Annotated[int, msgspec.Meta(ge=1)]


class ApiKeyConfig(_Section, frozen=True):
    """One [[auth.keys]] entry: a key (by SHA-256 hex, see `router hash-key`) and its tenant."""

    # SHA-256 hex of the key (`router hash-key KEY`; `router keygen` makes a new key and its hash).
    sha256: _SHA256_HEX
    # Tenant name: metrics, access log, cache namespace and limits are per tenant.
    tenant: str
    models: tuple[str, ...] = ()  # empty: every model
    requests_per_minute: _POSITIVE | None = None  # None: unlimited
    # Prompt plus completion tokens per minute (reserved up front, settled on the answer).
    tokens_per_minute: _POSITIVE | None = None
    request_burst: _POSITIVE | None = None  # None: one minute's worth
    # Tokens that may be spent at once (None: one minute's worth).
    token_burst: _POSITIVE | None = None
    # Requests in flight at once for this key (per machine: the workers of one `router serve`
    # share the count; None: unlimited).
    max_concurrent: _POSITIVE | None = None
    priority: int = 0  # higher waits less in admission queues
    cache_namespace: str | None = None  # None: the tenant name


class AuthConfig(_Section, frozen=True):
    """[auth]: API keys and tenants; `enabled = false` serves everyone anonymously (local use)."""

    # Require an API key on /v1 (false: everyone is one anonymous tenant).
    enabled: bool = True
    keys: tuple[ApiKeyConfig, ...] = ()
    # SHA-256 hex of the admin token guarding /admin/* (`router keygen` makes one); unset: admin
    # routes refused.
    admin_token_sha256: _SHA256_HEX | None = None


class LimitsConfig(_Section, frozen=True):
    """[limits]: per-key request/token rates, local or shared by instances through Redis."""

    # Where rate-limit buckets live: this router (one table its workers share), or Redis shared
    # by every router.
    backend: Literal["local", "redis"] = "local"
    # Redis for the shared backend: a redis://, rediss:// or unix:// URL (a password in it never
    # reaches the logs).
    redis_url: str = "redis://127.0.0.1:6379/0"
    # When Redis is unreachable or refusing (for all keys or one): "open" keeps serving with
    # local limits, "closed" answers 503.
    on_redis_error: Literal["open", "closed"] = "open"
    # Per background Redis call (requests never wait on Redis); a call that takes longer is an
    # outage: local limits only until Redis answers a ping and the lease script again (tried
    # every redis_retry_s).
    redis_timeout_ms: Annotated[float, msgspec.Meta(gt=0)] = 1000.0
    # How often Redis is tried while it is out (or while one key's call fails).
    redis_retry_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Most connections open to Redis (to each node of a Cluster) per router process. With all
    # in use (a stalled Redis holds each until redis_timeout_ms), a call opens no more: it
    # waits for one at most redis_timeout_ms and is an outage. In a Cluster, also the most
    # calls in flight to all its nodes together.
    redis_max_connections: _POSITIVE = 64
    # Prefix of every Redis key the limiter writes.
    redis_key_prefix: str = "router:rl:"
    # redis_url names one node of a Redis Cluster (keys are hash-tagged, one slot per key).
    redis_cluster: bool = False
    # Global limits are answered from slices of each key's global bucket leased from Redis in
    # the background (docs/LIMITS.md). Every lease_interval_s each instance tops up, pays and
    # gives back in one pipelined call (sooner when a key runs low and Redis has plenty).
    lease_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 0.25
    # A slice covers this long at the key's recent local rate ...
    lease_horizon_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # ... and holds at most this fraction of the key's burst. Accuracy bound: N instances admit
    # at most N * (max slice + credit) requests beyond one exact global bucket, once, not as a
    # sustained rate (lower both to tighten it, at the cost of more Redis calls).
    lease_max_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25
    # Before its first lease answer for a key, an instance admits this fraction of the key's
    # burst (at least one request) on credit, charged to the global bucket afterwards.
    lease_credit_fraction: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    # A key unseen this long at an instance gives its slice back and is forgotten there.
    lease_idle_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    # Tokens reserved for the completion when a request sets no max_tokens.
    default_max_tokens: Annotated[int, msgspec.Meta(ge=0)] = 256


class TokenizerConfig(_Section, frozen=True):
    """[tokenizers.models.<model>]: count a model's prompts exactly with its own tokenizer."""

    # A Hugging Face tokenizer.json (loaded at start-up; nothing is downloaded).
    file: str
    # The model's chat template (a Jinja file, e.g. the `chat_template` of its
    # tokenizer_config.json saved alone); unset: message texts only, plus a per-message overhead.
    chat_template: str | None = None
    # The template's `bos_token` and `eos_token` variables (from tokenizer_config.json).
    bos_token: str = ""
    # See bos_token.
    eos_token: str = ""
    # Tokens a message costs beyond its text when there is no template to render.
    per_message: Annotated[int, msgspec.Meta(ge=0)] = 4
    # Count the way llama.cpp does (the tokenizer adds BOS) rather than the template's own BOS.
    add_special_tokens: bool = False


class TokenizersConfig(_Section, frozen=True):
    """[tokenizers]: model (as regions serve it, or its alias) -> tokenizer; others use the
    built-in OpenAI encodings where the name says so, else an estimate of 4 bytes a token."""

    models: dict[str, TokenizerConfig] = msgspec.field(default_factory=dict)


class AdmissionConfig(_Section, frozen=True):
    """[admission]: per-region in-flight caps and the bounded priority wait queue."""

    # Requests in flight to one region at once (from the whole machine with workers); more wait.
    max_in_flight: _POSITIVE = 256
    # Per-region overrides of max_in_flight, by region name.
    region_max_in_flight: dict[str, _POSITIVE] = msgspec.field(default_factory=dict)
    # Requests that may wait for a slot per region (machine-wide with workers); beyond it, the
    # next region is tried.
    queue_size: Annotated[int, msgspec.Meta(ge=0)] = 256
    # Longest wait for a slot before trying the next region.
    max_wait_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0


class CacheModelConfig(_Section, frozen=True):
    """[cache.models.<model>]: per-model overrides of the [cache] defaults (unset: inherit)."""

    # Cache this model (unset: [cache] enabled).
    enabled: bool | None = None
    # Key level for this model (unset: [cache] level).
    level: Literal["exact", "normalized"] | None = None
    # Entry lifetime for this model (unset: [cache] ttl_s).
    ttl_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    # Highest cacheable temperature for this model (unset: [cache] max_temperature).
    max_temperature: Annotated[float, msgspec.Meta(ge=0)] | None = None
    # Unset temperature cacheable for this model (unset: [cache] value).
    cache_unset_temperature: bool | None = None
    # Requests with tools cacheable for this model (unset: [cache] value).
    allow_tools: bool | None = None


class CacheConfig(_Section, frozen=True):
    """[cache]: response cache: in-process tier, optional shared Redis tier, policy, coalescing."""

    # Off unless asked for: a cache changes what a proxy answers, so it is an explicit choice.
    enabled: bool = False
    # "exact" ignores only JSON whitespace and escapes, transport fields and the member order of
    # the request and of each message; "normalized" also folds blank space in message text (runs
    # between words, the ends of a text, a message's text parts taken as one text; never in code,
    # quotations, line ends or aligned columns).
    level: Literal["exact", "normalized"] = "exact"
    # Memory for the in-process tier; least recently used entries go first.
    max_bytes: Annotated[int, msgspec.Meta(gt=0)] = 64 << 20
    # A response bigger than this is served but never stored (and never buffered for storing;
    # a stream identical requests are following is kept whole until it ends, at most
    # server.max_response_bytes, so each of them gets it from its start).
    max_entry_bytes: Annotated[int, msgspec.Meta(gt=0)] = 1 << 20
    # How long an entry is served.
    ttl_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    # Cacheable only when temperature <= max_temperature; unset temperature means the upstream
    # default (1.0 for OpenAI), so it is cacheable only when cache_unset_temperature says so.
    max_temperature: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # See max_temperature: cache requests that set no temperature.
    cache_unset_temperature: bool = False
    # Cache requests that offer tools (their answers may call them; MCP servers and web search
    # too: their answers read the world outside the request).
    allow_tools: bool = False
    # Concurrent identical misses share one upstream request.
    coalesce: bool = True
    # The shared Redis tier: a redis://, rediss:// or unix:// URL (unset: in-process tier only).
    redis_url: str | None = None
    # Prefix of every Redis key the cache writes.
    redis_prefix: str = "router:cache"
    # Bounds one shared-tier call. A lookup runs beside the region request (the first useful
    # answer wins), so a slow or far Redis delays no miss; writes are in the background.
    redis_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # ... unless its measured round trip is under this: then it is asked first, which saves
    # the region a request on a hit for at most this much on a miss.
    shared_lookup_first_ms: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    # After a Redis failure, skip it for this long before trying again.
    redis_retry_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Most connections open to Redis (to each node of a Cluster) per router process. With all
    # in use (a stalled Redis holds each until redis_timeout_s), a call opens no more: it
    # waits for one at most redis_timeout_s and fails as a call Redis did not answer does (a
    # miss, Redis skipped for redis_retry_s). In a Cluster, also the most calls in flight to
    # all its nodes together.
    redis_max_connections: _POSITIVE = 64
    # redis_url names one node of a Redis Cluster (each entry is one key, so one slot).
    redis_cluster: bool = False
    models: dict[str, CacheModelConfig] = msgspec.field(default_factory=dict)


_SECONDS = Annotated[float, msgspec.Meta(gt=0)]
# The prober's times: at most a day (the native prober refuses more; longer is no use).
_PROBE_SECONDS = Annotated[float, msgspec.Meta(gt=0, le=86_400)]


class HealthConfig(_Section, frozen=True):
    """[health]: active probes (Rust prober thread), thresholds that flip health, ejection."""

    # Probe regions actively (passive health from traffic applies either way).
    enabled: bool = True
    # Time between probes of one region.
    interval_s: _PROBE_SECONDS = 1.0
    # +/- this fraction of interval_s at random, so regions are not probed in lockstep.
    jitter: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.1
    # A probe slower than this failed.
    timeout_s: _PROBE_SECONDS = 0.8
    # Probed with GET, relative to the region's origin.
    path: str = "/health"
    # Used for a region whose `path` answers 404 (llama.cpp, OpenAI).
    fallback_path: str = "/v1/models"
    # A PEM bundle trusted besides the system store for https regions (a private CA).
    ca_file: str | None = None
    # Statuses that count as a good probe; empty means any 2xx.
    expected_statuses: tuple[int, ...] = ()
    # Consecutive good probes that make an unhealthy region healthy.
    healthy_after: _POSITIVE = 2
    # Consecutive failed probes that make a healthy region unhealthy.
    unhealthy_after: _POSITIVE = 2
    # Weight of the newest sample in the moving averages of RTT and TTFT.
    ewma_alpha: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.3
    # Samples kept per region for its latency quantiles.
    window: _POSITIVE = 64
    # Outlier ejection: this many consecutive 5xx / connect failures / timeouts from real traffic
    # eject a region for base_ejection_s * 2^(k-1) (capped); a good probe afterwards reinstates it.
    eject_after: _POSITIVE = 5
    # See eject_after: the first ejection's length.
    base_ejection_s: _PROBE_SECONDS = 5.0
    # See eject_after: the longest ejection.
    max_ejection_s: _PROBE_SECONDS = 60.0
    # A TTFT estimate older than this (no traffic since) stops counting in the score, so a
    # region that was slow once gets traffic, and a fresh measurement, again.
    ttft_stale_s: _SECONDS = 30.0


class RoutingConfig(_Section, frozen=True):
    """[routing]: region selection, failover attempts, retry budget, hedging, mid-stream policy."""

    # Regions whose score (RTT + TTFT + bias) is within this of the best share load (P2C).
    tolerance_ms: Annotated[float, msgspec.Meta(ge=0)] = 20.0
    # Regions tried for one request, the first included (a spill past a full admission queue,
    # which no region saw, is not one); a fallback model gets as many again, at its own regions.
    max_attempts: _POSITIVE = 3
    # Retries (attempts after the first) stay under min + ratio * requests over the window.
    retry_budget_ratio: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.2
    # See retry_budget_ratio: retries always allowed per window.
    retry_budget_min: Annotated[int, msgspec.Meta(ge=0)] = 10
    # See retry_budget_ratio: the window.
    retry_budget_window_s: _SECONDS = 10.0
    # Give up on a region that sent no first byte in this long (None: timeouts.first_byte).
    ttft_timeout_s: _SECONDS | None = None
    # A stream's first token (not only its headers, role preamble, keep-alive comments or
    # other fields without data) must come within this, when another region or a fallback
    # model can serve the request; None turns it off.
    stream_ttft_timeout_s: _SECONDS | None = 10.0
    # A region asking (Retry-After) to wait longer than this is not waited for.
    max_retry_after_s: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    # Endpoints (e.g. "/v1/chat/completions") that hedge: after hedge_delay_ms without a first
    # byte (None: the region's p95 TTFT), also ask the next region; the first byte wins.
    hedge_endpoints: tuple[str, ...] = ()
    # See hedge_endpoints.
    hedge_delay_ms: _SECONDS | None = None
    # A stream that breaks after tokens were sent: "error" ends it with an SSE error event,
    # "resume" continues on another region with the streamed text as an assistant prefill
    # (completions: after the prompt), or regenerates a deterministic request and catches up.
    midstream: Literal["error", "resume"] = "error"
    # Continuations of one broken stream at most (midstream = "resume").
    max_resumes: Annotated[int, msgspec.Meta(ge=0)] = 2
    # When no region is available, still try them (ejected first) instead of answering 503.
    panic_routing: bool = True
    # Circuit per (region, model): this many consecutive failures of a model in a region send
    # its traffic elsewhere first for circuit_base_s * 2^(k-1) s (at most circuit_max_s), then
    # one request tries it again (a trial: its success closes the circuit, a failure there opens
    # it again for longer, any other ending lets the next request try). A region that answers
    # with an error is alive: its other models keep their traffic (ejection is for regions that
    # cannot be reached).
    circuit_after: _POSITIVE = 3
    # See circuit_after: how long a circuit first stays open.
    circuit_base_s: _SECONDS = 5.0
    # See circuit_after: the longest a circuit stays open.
    circuit_max_s: _SECONDS = 30.0


class StateConfig(_Section, frozen=True):
    """[state]: which region holds each stored Responses API response (its follow-ups and
    reads go there), noted per router and optionally shared through Redis."""

    # Responses noted in this router's memory (a response's output items are notes too, for
    # `item_reference`); past it, the least recently used note of the tenant holding the most
    # goes.
    max_responses: _POSITIVE = 100_000
    # Redis the routers of a deployment share the notes through (a redis://, rediss:// or
    # unix:// URL), so a follow-up may reach any of them; unset: each router knows only the
    # responses it relayed.
    redis_url: str | None = None
    # redis_url names one node of a Redis Cluster.
    redis_cluster: bool = False
    # A lookup Redis does not answer in this long is a 503 state_unavailable (never routed
    # unchecked): set it above the round trip to Redis (a far one's too).
    redis_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 0.25
    # Most connections open to Redis (to each node of a Cluster) per router process. With all
    # in use (a stalled Redis holds each until redis_timeout_s), a call opens no more: a lookup
    # waits for one at most redis_timeout_s, then is the same 503. In a Cluster, also the most
    # calls in flight to all its nodes together.
    redis_max_connections: _POSITIVE = 64
    # Prefix of the keys, one per response.
    redis_prefix: str = "router:resp:"
    # How long a note lives in Redis (OpenAI keeps stored responses for 30 days).
    ttl_s: _SECONDS = 2_592_000.0


class ObservabilityConfig(_Section, frozen=True):
    """[observability]: metrics, access log, SLO targets, status page."""

    # Off: no timing middleware, Server-Timing, /metrics, /status or access log (benchmarks).
    enabled: bool = True
    # The `router.access` logger: one line per request, JSON or plain, to stdout.
    access_log: bool = True
    # Lines are written in batches at most this long after the first (Envoy flushes every
    # second); 0 writes each line at once. A SIGKILL loses at most this much of the log.
    access_log_flush_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 1000
    # Level of the operational logs and of the access log.
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Format of the access log and the operational logs: JSON lines or plain text.
    log_format: Literal["json", "plain"] = "json"
    # SLO objectives over a rolling window: TTFT p95 and error ratio (of what the router set out
    # to serve: clients' own 4xx count for neither).
    slo_ttft_p95_ms: Annotated[float, msgspec.Meta(gt=0)] = 200.0
    # See slo_ttft_p95_ms: the error ratio objective (5xx, regions' 429s passed on, streams
    # ended by a failure event).
    slo_error_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.001
    # See slo_ttft_p95_ms: the rolling window.
    slo_window_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    # Relative error of the streaming TTFT quantiles.
    quantile_accuracy: Annotated[float, msgspec.Meta(gt=0, lt=0.5)] = 0.01
    # How often the /status page polls /status.json.
    status_refresh_ms: Annotated[int, msgspec.Meta(ge=100)] = 1000
    # OpenTelemetry traces over OTLP/HTTP to this URL (e.g. "http://collector:4318/v1/traces");
    # unset: no tracing. Needs `pip install 'router[otel]'`.
    otlp_endpoint: str | None = None
    # The `service.name` resource attribute of the router's spans.
    service_name: str = "router"
    # Fraction of new traces sampled; a client's sampled traceparent is always followed.
    trace_sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0


# A version's weight at most: weights are relative, and past this a sticky key's score (weight /
# -ln(u)) or the weights' sum could overflow to infinity, where ties pick the first version.
MAX_WEIGHT = 1e9


class DeploymentConfig(_Section, frozen=True):
    """One [[rollout.models.<alias>.deployments]] entry: a version of an alias."""

    # Version tag, unique within the alias (access log, rollback, x-router-model-version).
    version: str
    # The name regions serve it under (a model in some region's `models`).
    model: str
    # Regions allowed to serve this version; empty means every region serving `model`.
    regions: tuple[str, ...] = ()
    # Share of the alias's traffic this version gets (relative to the others).
    weight: Annotated[float, msgspec.Meta(ge=0, le=MAX_WEIGHT)] = 0.0


class RolloutModelConfig(_Section, frozen=True):
    """[rollout.models.<alias>]: a versioned alias; clients send the alias as `model`."""

    deployments: tuple[DeploymentConfig, ...]
    # Where a rollback sends everyone; defaults to the first deployment.
    stable: str | None = None
    # What keeps a client on one version: the `user` field (else the API key), the key, or nothing.
    sticky: Literal["user", "api_key", "none"] = "user"


class CanaryConfig(_Section, frozen=True):
    """[rollout.canary]: when a canary counts as worse than stable; whether to roll it back."""

    # Roll a worse canary back to stable automatically (else only report it).
    auto_rollback: bool = False
    # Samples older than this are forgotten.
    window_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # Both versions need this many requests in the window before they are compared.
    min_samples: Annotated[int, msgspec.Meta(ge=1)] = 50
    # Roll back when canary error rate minus stable error rate exceeds this.
    max_error_rate_delta: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    # Roll back when canary TTFT p95 over stable TTFT p95 exceeds this; streams are compared by
    # their time to first token, whole answers by their time to the whole answer, each kind
    # only with the same kind...
    max_ttft_p95_ratio: Annotated[float, msgspec.Meta(gt=1)] = 2.0
    # ... and the canary's p95 is at least this much slower too, so two fast versions a few
    # milliseconds apart never count as worse.
    min_ttft_p95_delta_ms: Annotated[float, msgspec.Meta(ge=0)] = 20.0
    # Per-version memory cap; the oldest samples go first.
    max_samples: Annotated[int, msgspec.Meta(ge=1)] = 4096
    # How often the canary is compared with stable.
    check_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0


class RolloutConfig(_Section, frozen=True):
    """[rollout]: versioned model aliases with weighted, sticky traffic split; canary policy."""

    models: dict[str, RolloutModelConfig] = msgspec.field(default_factory=dict)
    canary: CanaryConfig = msgspec.field(default_factory=CanaryConfig)


class Config(_Section, frozen=True):
    """The whole config file."""

    regions: tuple[RegionConfig, ...]
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    timeouts: TimeoutsConfig = msgspec.field(default_factory=TimeoutsConfig)
    models: ModelsConfig = msgspec.field(default_factory=ModelsConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    tokenizers: TokenizersConfig = msgspec.field(default_factory=TokenizersConfig)
    admission: AdmissionConfig = msgspec.field(default_factory=AdmissionConfig)
    cache: CacheConfig = msgspec.field(default_factory=CacheConfig)
    health: HealthConfig = msgspec.field(default_factory=HealthConfig)
    routing: RoutingConfig = msgspec.field(default_factory=RoutingConfig)
    state: StateConfig = msgspec.field(default_factory=StateConfig)
    observability: ObservabilityConfig = msgspec.field(default_factory=ObservabilityConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)

    def served_models(self) -> tuple[str, ...]:
        """Every model name a client may ask for: aliases first, then region models, sorted."""
        names = set(self.models.aliases) | set(self.rollout.models)
        for region in self.regions:
            names.update(region.models)
        return tuple(sorted(names))

    def upstream_models(self, name: str) -> frozenset[str]:
        """The model names regions serve for a client-facing name: a rollout's versions', an
        alias's target, else the name itself."""
        rollout = self.rollout.models.get(name)
        if rollout is not None:
            return frozenset(d.model for d in rollout.deployments)
        return frozenset({self.models.aliases.get(name, name)})

    def endpoints_of(self, name: str) -> tuple[Endpoint, ...]:
        """The APIs some region serves a client-facing model name on, in the usual order."""
        models = self.upstream_models(name)
        served: set[str] = set()
        for region in self.regions:
            if models.intersection(region.models):
                served.update(region.served_endpoints())
        return tuple(e for e in _ALL_ENDPOINTS if e in served)


# A reload in two steps: given (old, new) config a component builds its new state without
# touching the live one and returns the swap (Commit); raising ConfigError or ValueError
# rejects the whole reload. The commit must not fail.
Commit = Callable[[], None]
Preparer = Callable[["Config", "Config"], Commit]

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def _field_path(raw: str) -> str:
    """`$.regions[0].name` -> `regions[0].name`."""
    return raw.lstrip(".") or "(top level)"


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port` -> (host, port); raises ValueError naming what was expected."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected 'host:port', got {value!r}")
    return host.strip("[]"), int(port)


def _check(config: Config, source: str) -> None:
    """Cross-field rules a schema cannot express."""

    def fail(field: str, expected: str) -> ConfigError:
        return ConfigError(f"{source}: field `{field}`: {expected}")

    if not config.regions:
        raise fail("regions", "expected at least one [[regions]] entry")
    for key in ("listen", "admin_listen"):
        value = getattr(config.server, key)
        if value is not None:
            try:
                parse_listen(value)
            except ValueError as exc:
                raise fail(f"server.{key}", str(exc)) from None
    if config.server.max_body_bytes <= 0:
        raise fail("server.max_body_bytes", "expected a positive number of bytes")
    for key in ("header_timeout_s", "body_timeout_s", "drain_timeout_s"):
        if getattr(config.server, key) <= 0:
            raise fail(f"server.{key}", "expected a positive number of seconds")
    for key in ("connect", "first_byte", "idle", "total"):
        if getattr(config.timeouts, key) <= 0:
            raise fail(f"timeouts.{key}", "expected a positive number of seconds")
    seen: set[str] = set()
    served: set[str] = set()
    for i, region in enumerate(config.regions):
        where = f"regions[{i}]"
        if not region.name:
            raise fail(f"{where}.name", "expected a non-empty name")
        if region.name in seen:
            raise fail(f"{where}.name", f"expected a unique name, {region.name!r} is repeated")
        seen.add(region.name)
        if not region.base_url.startswith(("http://", "https://")):
            raise fail(f"{where}.base_url", f"expected an http(s) URL, got {region.base_url!r}")
        if not region.models:
            raise fail(f"{where}.models", "expected at least one model name")
        if region.weight <= 0:
            raise fail(f"{where}.weight", "expected a positive weight")
        if region.max_connections <= 0:
            raise fail(f"{where}.max_connections", "expected a positive connection count")
        if region.keepalive_s <= 0:
            raise fail(f"{where}.keepalive_s", "expected a positive number of seconds")
        served.update(region.models)
    # Names that travel in response headers (x-router-region, x-router-model-version, ...),
    # metric labels and log lines: a control character breaks the first and garbles the rest.
    for i, region in enumerate(config.regions):
        _check_printable(fail, f"regions[{i}].name", region.name)
        for model in region.models:
            _check_printable(fail, f"regions[{i}].models", model)
    for alias in config.models.aliases:
        _check_printable(fail, "models.aliases", alias)
    for alias, spec in config.rollout.models.items():
        _check_printable(fail, "rollout.models", alias)
        for j, d in enumerate(spec.deployments):
            _check_printable(fail, f"rollout.models.{alias}.deployments[{j}].version", d.version)
    for alias, target in config.models.aliases.items():
        if target not in served:
            raise fail(
                f"models.aliases.{alias}", f"expected a model some region serves, got {target!r}"
            )
    for name in config.admission.region_max_in_flight:
        if name not in seen:
            raise fail(
                f"admission.region_max_in_flight.{name}",
                f"expected a region's name ({', '.join(sorted(seen))}), got {name!r}",
            )
    everything = set(config.served_models())
    for model, chain in config.models.fallbacks.items():
        where = f"models.fallbacks.{model}"
        if model not in everything:
            raise fail(where, f"expected a model clients may ask for, got {model!r}")
        for fallback in chain:
            if fallback not in everything or fallback == model:
                raise fail(where, f"expected other served models, got {fallback!r}")
    for field, url in (
        ("limits.redis_url", config.limits.redis_url),
        ("cache.redis_url", config.cache.redis_url),
        ("state.redis_url", config.state.redis_url),
    ):
        wrong = None if url is None else config_redis.problem(url)
        if wrong is not None:
            raise fail(field, wrong)
    routing = config.routing
    if routing.circuit_base_s > routing.circuit_max_s:
        raise fail(
            "routing.circuit_base_s",
            f"expected at most routing.circuit_max_s ({routing.circuit_max_s}), "
            f"got {routing.circuit_base_s}",
        )
    _check_rollout(config, source)


def _check_printable(fail: Callable[[str, str], ConfigError], field: str, name: str) -> None:
    if not name.isprintable():
        raise fail(field, f"expected a name without control characters, got {name!r}")


def _check_rollout(config: Config, source: str) -> None:
    """[rollout]: each version names a served model, in regions that serve it; weights add up."""

    def fail(field: str, expected: str) -> ConfigError:
        return ConfigError(f"{source}: field `{field}`: {expected}")

    serving: dict[str, set[str]] = {}
    for region in config.regions:
        for model in region.models:
            serving.setdefault(model, set()).add(region.name)
    for alias, spec in config.rollout.models.items():
        where = f"rollout.models.{alias}"
        if alias in config.models.aliases:
            raise fail(where, f"expected one definition, {alias!r} is also in models.aliases")
        if not spec.deployments:
            raise fail(f"{where}.deployments", "expected at least one deployment")
        versions = [d.version for d in spec.deployments]
        for i, d in enumerate(spec.deployments):
            at = f"{where}.deployments[{i}]"
            if not d.version:
                raise fail(f"{at}.version", "expected a non-empty version tag")
            if d.version in versions[:i]:
                raise fail(f"{at}.version", f"expected a unique tag, {d.version!r} is repeated")
            if d.model not in serving:
                raise fail(f"{at}.model", f"expected a model some region serves, got {d.model!r}")
            for r in d.regions:
                if r not in serving[d.model]:
                    raise fail(f"{at}.regions", f"expected regions serving {d.model!r}, got {r!r}")
        if spec.stable is not None and spec.stable not in versions:
            raise fail(f"{where}.stable", f"expected one of {versions}, got {spec.stable!r}")
        if sum(d.weight for d in spec.deployments) <= 0:
            raise fail(f"{where}.deployments", "expected at least one positive weight")


_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")
_INDEX = re.compile(r"\[[^\]]*\]")


def _struct_at(path: str) -> type[msgspec.Struct] | None:
    """The Struct decoding `$.a.b[0].c` (dict keys and list indexes stepped over)."""
    parts = [p for p in _INDEX.sub("", path).split(".") if p]
    cls: Any = Config
    for part in parts:
        hints = typing.get_type_hints(cls, include_extras=True)
        if part not in hints:
            # A key of a table of sections (cache.models.<name>): already inside its value type.
            continue
        cls = _struct_in(hints[part])
        if cls is None:
            return None
    return cls if isinstance(cls, type) and issubclass(cls, msgspec.Struct) else None


def _struct_in(tp: Any) -> type[msgspec.Struct] | None:
    for candidate in (tp, *typing.get_args(tp)):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
        if typing.get_origin(candidate) in (tuple, dict):
            found = _struct_in(typing.get_args(candidate)[-1])
            if found is not None:
                return found
    return None


def _hint(what: str, path: str) -> str:
    """What to add to a validation error: a close field name, or how to hash a raw key."""
    unknown = _UNKNOWN.match(what)
    if unknown is not None:
        cls = _struct_at(path)
        names = list(cls.__struct_fields__) if cls is not None else []
        close = difflib.get_close_matches(unknown["name"], names, n=1, cutoff=0.6)
        return f" (did you mean `{close[0]}`?)" if close else ""
    if path.endswith("sha256") and "matching" in what:
        return (
            " (this field holds the SHA-256 hex of a key, never the key itself: "
            "run `router hash-key KEY`, or `router keygen` for a new key and its hash)"
        )
    return ""


def loads(text: str, source: str = "<config>", env: Mapping[str, str] | None = None) -> Config:
    """Decode and check config text; `source` names the file in errors; `env` overrides
    per-host fields (config_env: ROUTER_<SECTION>_<FIELD>)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    if env is not None:
        try:
            applied = config_env.apply(raw, env)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if applied:
            source += " (with " + ", ".join(name for name, _ in applied) + ")"
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        match = _AT.match(str(exc))
        assert match is not None  # the pattern matches any string
        path = match["path"]
        what = match["what"]
        if path is None:
            raise ConfigError(f"{source}: {what}{_hint(what, '')}") from None
        field = _field_path(path)
        raise ConfigError(f"{source}: field `{field}`: {what}{_hint(what, field)}") from None
    _check(config, source)
    return config


def read(path: str | Path) -> str:
    """The text of the config file at `path`; ConfigError naming it if it cannot be read."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config: {exc}") from None


def load(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, decode and check the config file at `path`, with the process environment's
    overrides unless `env` is given."""
    return loads(read(path), str(Path(path)), os.environ if env is None else env)
