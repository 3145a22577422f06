"""Per-key request and token rates (Rust BucketTable, optionally shared through Redis), 429s."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from router.access import auth as auth_mod
from router.access.auth import AUTH_NS, TENANT, Authenticator, Tenant
from router.access.global_limits import Rates, RedisBuckets
from router.access.usage import StreamUsage, completion_budget, usage_tokens
from router.errors import ApiError, ConfigError, RateLimited, Unavailable
from router.native import (
    BucketTable,
    NativeError,
    count_request_tokens,
    encoding_for_model,
)
from router.observability.timing import AUTH, RATE_LIMIT
from router.routing.admission import ADMISSION, Admission
from router.server.reload import RELOADER, Commit, Preparer

if TYPE_CHECKING:
    from router.config import Config, LimitsConfig
    from router.core.context import RequestContext
    from router.core.request import ParsedRequest

# A dimension without a configured limit still goes through the table; this never runs out.
_UNLIMITED = 1 << 40


def format_reset(seconds: float) -> str:
    """A duration the way OpenAI writes x-ratelimit-reset-*: 250ms, 1.5s, 6m0s."""
    seconds = min(seconds, 86400.0) if math.isfinite(seconds) else 86400.0
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def rate_headers(
    tenant: Tenant,
    remaining_requests: int,
    remaining_tokens: int,
    reset_requests_s: float,
    reset_tokens_s: float,
) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the dimensions the tenant is limited on."""
    headers: dict[str, str] = {}
    if tenant.requests_per_minute is not None:
        headers["x-ratelimit-limit-requests"] = str(tenant.requests_per_minute)
        headers["x-ratelimit-remaining-requests"] = str(max(0, remaining_requests))
        headers["x-ratelimit-reset-requests"] = format_reset(reset_requests_s)
    if tenant.tokens_per_minute is not None:
        headers["x-ratelimit-limit-tokens"] = str(tenant.tokens_per_minute)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, remaining_tokens))
        headers["x-ratelimit-reset-tokens"] = format_reset(reset_tokens_s)
    return headers


def retry_headers(retry_after_s: float) -> dict[str, str]:
    """Retry-After (whole seconds, at least 1) and the SDKs' more precise retry-after-ms."""
    # A bucket that can never fit the request says inf; an hour is as good an answer.
    retry_after_s = min(max(retry_after_s, 0.0), 3600.0) if math.isfinite(retry_after_s) else 3600.0
    return {
        "Retry-After": str(max(1, math.ceil(retry_after_s))),
        "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000))),
    }


def rates_of(tenant: Tenant) -> Rates | None:
    """Bucket parameters of a tenant, or None when it has no rate limit at all."""
    rpm, tpm = tenant.requests_per_minute, tenant.tokens_per_minute
    if rpm is None and tpm is None:
        return None
    rpm = rpm or _UNLIMITED
    tpm = tpm or _UNLIMITED
    return Rates(
        request_capacity=float(tenant.request_burst or rpm),
        requests_per_s=rpm / 60,
        token_capacity=float(tenant.token_burst or tpm),
        tokens_per_s=tpm / 60,
    )


@dataclass(slots=True)
class Grant:
    """An admitted request's reservation: headers to send, then finish() exactly once."""

    headers: dict[str, str]
    _limiter: Limiter | None
    _tenant: Tenant
    _reserved: int
    _shared: bool

    def finish(self, used_tokens: int | None) -> None:
        """Settle with the real usage (None: keep the estimate) and free the concurrency slot."""
        limiter, self._limiter = self._limiter, None
        if limiter is not None:
            limiter.settle(self._tenant, self._reserved, used_tokens, shared=self._shared)


class Limiter:
    """Admission by per-key buckets: local always, Redis too in global mode."""

    def __init__(
        self,
        tenants: Iterable[Tenant],
        *,
        default_max_tokens: int = 256,
        shared: RedisBuckets | None = None,
        fail_open: bool = True,
        shards: int = 64,
    ) -> None:
        self.default_max_tokens = default_max_tokens
        self.shared = shared
        self.fail_open = fail_open
        self.table = BucketTable(shards=shards)
        self._rates: dict[str, Rates] = {}
        for tenant in tenants:
            self.configure(tenant)
        self._active: dict[str, int] = {}
        self._encodings: dict[str, str] = {}

    @classmethod
    def from_config(cls, config: LimitsConfig, tenants: Iterable[Tenant]) -> Limiter:
        """Build from the `[limits]` section and the tenants auth knows."""
        shared = RedisBuckets.from_config(config) if config.backend == "redis" else None
        return cls(
            tenants,
            default_max_tokens=config.default_max_tokens,
            shared=shared,
            fail_open=config.on_redis_error == "open",
        )

    def configure(self, tenant: Tenant) -> None:
        """Install a tenant's limits in the local table."""
        rates = rates_of(tenant)
        if rates is None:
            self._rates.pop(tenant.key_id, None)
            return
        self._rates[tenant.key_id] = rates
        self.table.set_limits(
            tenant.key_id,
            requests_per_minute=tenant.requests_per_minute or _UNLIMITED,
            tokens_per_minute=tenant.tokens_per_minute or _UNLIMITED,
            request_burst=tenant.request_burst,
            token_burst=tenant.token_burst,
        )

    def estimate(self, parsed: ParsedRequest) -> int:
        """Tokens to reserve at admission: the prompt (Rust counter) plus the completion budget."""
        _, prompt, budget = self.estimate_parts(parsed)
        return prompt + budget

    def estimate_parts(self, parsed: ParsedRequest) -> tuple[str, int, int]:
        """(encoding, prompt tokens, completion budget) of a request."""
        model = parsed.upstream_model or parsed.model
        encoding = self._encodings.get(model)
        if encoding is None:
            encoding = self._encodings[model] = encoding_for_model(model)
        try:
            prompt = count_request_tokens(parsed.body, encoding)
        except NativeError:
            # A body the request stage accepted but the counter cannot read: estimate, never 500.
            prompt = len(parsed.body) // 4 + 1
        if parsed.endpoint.endswith("/embeddings"):
            return encoding, prompt, 0
        return encoding, prompt, completion_budget(parsed.body, self.default_max_tokens)

    async def admit(self, tenant: Tenant, tokens: int) -> Grant:
        """Reserve one request and `tokens` for the tenant, or raise 429 (503 if fail-closed)."""
        key = tenant.key_id
        active = self._active.get(key, 0)
        if tenant.max_concurrent is not None and active >= tenant.max_concurrent:
            raise RateLimited(
                f"Too many concurrent requests for tenant {tenant.name!r} "
                f"(limit {tenant.max_concurrent}).",
                code="concurrency_limit_exceeded",
                headers=retry_headers(1.0),
            )
        rates = self._rates.get(key)
        if rates is None:
            self._active[key] = active + 1
            return Grant({}, self, tenant, 0, False)
        if tenant.tokens_per_minute is None:
            tokens = 0
        elif tokens > rates.token_capacity:
            raise RateLimited(
                f"Request too large for tenant {tenant.name!r}: it may use {tokens} tokens, "
                f"more than the {int(rates.token_capacity)} one request can ever get. Lower "
                "max_tokens or shorten the prompt.",
                code="request_too_large",
                headers={"x-should-retry": "false"},
            )
        allowed, retry_s, rem_r, rem_t, reset_r, reset_t = self.table.try_acquire(key, tokens)
        if not allowed:
            headers = rate_headers(tenant, rem_r, rem_t, reset_r, reset_t)
            raise self._limited(tenant, retry_s, headers)
        # Counted before any await so concurrent admissions see each other.
        self._active[key] = active + 1
        shared = False
        if self.shared is not None:
            try:
                decision = await self.shared.acquire(key, rates, tokens)
            except BaseException:
                self._undo(tenant, tokens)
                raise
            if decision is None and not self.fail_open:
                self._undo(tenant, tokens)
                raise Unavailable(
                    "The shared rate-limit store is unreachable; retry shortly.",
                    code="rate_limit_store_unavailable",
                    headers=retry_headers(self.shared.retry_s),
                )
            if decision is not None:
                rem_r, rem_t = decision.remaining_requests, decision.remaining_tokens
                reset_r, reset_t = decision.reset_requests_s, decision.reset_tokens_s
                if not decision.allowed:
                    self._undo(tenant, tokens)
                    headers = rate_headers(tenant, rem_r, rem_t, reset_r, reset_t)
                    raise self._limited(tenant, decision.retry_after_s, headers)
                shared = True
        return Grant(
            rate_headers(tenant, rem_r, rem_t, reset_r, reset_t), self, tenant, tokens, shared
        )

    def _undo(self, tenant: Tenant, tokens: int) -> None:
        """Take back a local reservation the shared store refused (or could not make)."""
        self.table.refund(tenant.key_id, requests=1, tokens=tokens)
        self._release(tenant.key_id)

    def _release(self, key: str) -> None:
        left = self._active.get(key, 1) - 1
        if left > 0:
            self._active[key] = left
        else:
            self._active.pop(key, None)

    @staticmethod
    def _limited(tenant: Tenant, retry_s: float, headers: dict[str, str]) -> RateLimited:
        return RateLimited(
            f"Rate limit reached for tenant {tenant.name!r}; retry in {max(retry_s, 0.001):.3g}s.",
            headers={**headers, **retry_headers(retry_s)},
        )

    def settle(self, tenant: Tenant, reserved: int, used: int | None, *, shared: bool) -> None:
        """Reconcile a reservation with real usage and free its concurrency slot."""
        self._release(tenant.key_id)
        rates = self._rates.get(tenant.key_id)
        if used is None or rates is None or tenant.tokens_per_minute is None or used == reserved:
            return
        self.table.reconcile(tenant.key_id, reserved, used)
        if shared and self.shared is not None:
            self.shared.adjust_later(tenant.key_id, rates, reserved - used)

    async def close(self) -> None:
        """Close the shared store's connections."""
        if self.shared is not None:
            await self.shared.close()


# The admitted request's reservation, and the usage meter of a streamed answer.
GRANT: web.RequestKey[Grant] = web.RequestKey("router.limits.grant", Grant)
METER: web.RequestKey[StreamUsage] = web.RequestKey("router.limits.meter", StreamUsage)
LIMITER: web.AppKey[Limiter] = web.AppKey("router.limits.limiter", Limiter)
# ctx.extra key under which the tenant is left for later features (the cache's namespace).
TENANT_EXTRA = "tenant"

Stage = Callable[[web.Request, "RequestContext"], Awaitable[web.StreamResponse | None]]


def used_tokens(request: web.Request, response: web.StreamResponse) -> int | None:
    """Real usage of an answered request; 0 for an error, None when it is unknown."""
    if response.status >= 400:
        return 0
    if isinstance(response, web.Response):
        body = response.body
        return usage_tokens(body) if isinstance(body, bytes) else None
    meter = request.get(METER)
    return meter.used() if meter is not None else None


@web.middleware
async def settle(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Reconcile the request's reservation when its answer has ended, however it ended."""
    try:
        response = await handler(request)
    except ApiError:
        # Answered with an error after admission (no region could take it): nothing generated.
        grant = request.get(GRANT)
        if grant is not None:
            grant.finish(0)
        raise
    except BaseException:
        # The client left (or a bug): whatever a stream had carried so far, else the estimate.
        grant = request.get(GRANT)
        if grant is not None:
            meter = request.get(METER)
            grant.finish(meter.used() if meter is not None else None)
        raise
    grant = request.get(GRANT)
    if grant is not None:
        grant.finish(used_tokens(request, response))
    return response


async def add_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """on_response_prepare: the tenant's x-ratelimit-* headers on every answer it gets."""
    grant = request.get(GRANT)
    if grant is not None:
        response.headers.update(grant.headers)


def admission_stage(auth: Authenticator, limiter: Limiter) -> Stage:
    """The first stage after parsing: model permission, then the rate limits."""

    async def admit(request: web.Request, ctx: RequestContext) -> None:
        tenant = request[TENANT]
        ctx.extra[TENANT_EXTRA] = tenant
        ctx.timer.record(AUTH, request.get(AUTH_NS, 0))
        auth.authorize_model(tenant, ctx.request.model)
        ctx.timer.begin(RATE_LIMIT)
        try:
            encoding, prompt, budget = None, 0, 0
            if tenant.tokens_per_minute:
                encoding, prompt, budget = limiter.estimate_parts(ctx.request)
            request[GRANT] = await limiter.admit(tenant, prompt + budget)
        finally:
            ctx.timer.end(RATE_LIMIT)
        if ctx.request.stream:
            request[METER] = StreamUsage(prompt, encoding)
        return None

    return admit


def auth_preparer(auth: Authenticator, limiter: Limiter) -> Preparer:
    """[auth] on reload: keys added, revoked or re-limited at once; bucket levels kept."""

    def prepare(old: Config, new: Config) -> Commit:
        if new.auth == old.auth:
            return lambda: None
        # Other features built their admin guards and cache namespaces from these at startup.
        for field in ("enabled", "admin_token_sha256"):
            if getattr(new.auth, field) != getattr(old.auth, field):
                raise ConfigError(f"field `auth.{field}`: changed; restart the router to apply it")
        fresh = Authenticator.from_config(new.auth)

        def commit() -> None:
            for tenant in fresh.tenants:
                limiter.configure(tenant)
            auth.adopt(fresh)

        return commit

    return prepare


def install(app: web.Application, config: Config, auth: Authenticator, stages: list[Stage]) -> None:
    """Wire `auth` (built from config.auth), rate limits and admission into the app (before it
    starts)."""
    auth.warn_if_disabled()
    limiter = Limiter.from_config(config.limits, auth.tenants)
    app[LIMITER] = limiter
    app[ADMISSION] = Admission.from_config(config.admission)
    app.middlewares.append(auth_mod.middleware(auth))
    app.middlewares.append(settle)
    stages.insert(0, admission_stage(auth, limiter))
    app.on_response_prepare.append(add_headers)
    reloader = app.get(RELOADER)
    if reloader is not None:
        reloader.register("auth", auth_preparer(auth, limiter), ("auth",))

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        yield
        await limiter.close()

    app.cleanup_ctx.append(lifetime)
