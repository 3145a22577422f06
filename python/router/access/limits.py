"""Per-key request and token rates (Rust BucketTable; global ones from slices leased from Redis)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from router.access.auth import Authenticator, Tenant
from router.access.global_limits import UNLIMITED, GlobalLeases, Rates
from router.access.prompts import chat_view
from router.access.shared_buckets import SharedBucketTable
from router.access.tokenizers import ModelTokenizer
from router.access.usage import StreamUsage, completion_budget, usage_tokens
from router.config import Commit, Preparer
from router.core.request import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    INPUT_TOKENS,
    MESSAGES,
    RESPONSES,
    ParsedRequest,
)
from router.core.timing import AUTH, RATE_LIMIT
from router.errors import RateLimited, Unavailable
from router.native import (
    BucketTable,
    NativeError,
    count_request_tokens,
    encoding_for_model,
)

if TYPE_CHECKING:
    from router.config import Config, LimitsConfig
    from router.core.context import RequestContext
    from router.core.request import ParsedRequest

# A dimension without a configured limit still goes through the table; this never runs out.
_UNLIMITED = UNLIMITED
# APIs whose prompts are counted as the chat request they render to (access.prompts).
_VIEWED = frozenset({RESPONSES, MESSAGES})
_COUNTS = frozenset({INPUT_TOKENS, COUNT_TOKENS})


def format_reset(seconds: float) -> str:
    """A duration the way OpenAI writes x-ratelimit-reset-*: 250ms, 1.5s, 6m0s."""
    # A bucket that never refills (a rate of 0) says inf: a day stands for "not soon".
    seconds = seconds if math.isfinite(seconds) else 86400.0
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
    """An admitted request's reservation: headers to send, then settle exactly once."""

    headers: dict[str, str]
    _limiter: Limiter | None
    _tenant: Tenant
    _reserved: int
    _shared: bool
    # A streamed answer's usage meter (set by the admission stage).
    meter: StreamUsage | None = None

    def finish(self, used_tokens: int | None) -> None:
        """Settle with the real usage (None: keep the estimate) and free the concurrency slot."""
        limiter, self._limiter = self._limiter, None
        if limiter is not None:
            limiter.settle(self._tenant, self._reserved, used_tokens, shared=self._shared)

    def settle(self, answer: web.StreamResponse | None, generated: bool | None) -> None:
        """Settle with what `answer` used; nothing when nothing was generated, the stream's
        count so far (else the estimate) when the client left."""
        if generated is False:
            self.finish(0)
        elif answer is None:
            self.finish(self.meter.used() if self.meter is not None else None)
        else:
            self.finish(used_tokens(answer, self.meter))


class Limiter:
    """Admission by per-key buckets: local always, Redis too in global mode."""

    def __init__(
        self,
        tenants: Iterable[Tenant],
        *,
        default_max_tokens: int = 256,
        shared: GlobalLeases | None = None,
        fail_open: bool = True,
        shards: int = 64,
        machine: SharedBucketTable | None = None,
        tokenizers: Mapping[str, ModelTokenizer] | None = None,
    ) -> None:
        self.default_max_tokens = default_max_tokens
        self.shared = shared
        self.fail_open = fail_open
        # With workers, buckets and in-flight counts live in a table all of them share.
        self.machine = machine
        self.table: BucketTable | SharedBucketTable = (
            machine if machine is not None else BucketTable(shards=shards)
        )
        self._rates: dict[str, Rates] = {}
        for tenant in tenants:
            self.configure(tenant)
        self._active: dict[str, int] = {}
        self._encodings: dict[str, str] = {}
        # Models counted exactly with their own tokenizer ([tokenizers]).
        self.tokenizers = dict(tokenizers or {})

    @classmethod
    def from_config(
        cls,
        config: LimitsConfig,
        tenants: Iterable[Tenant],
        machine: SharedBucketTable | None = None,
        tokenizers: Mapping[str, ModelTokenizer] | None = None,
    ) -> Limiter:
        """Build from the `[limits]` section, the tenants auth knows and the model tokenizers;
        `machine`: the table the workers of this machine share."""
        shared = GlobalLeases.from_config(config) if config.backend == "redis" else None
        return cls(
            tenants,
            default_max_tokens=config.default_max_tokens,
            shared=shared,
            fail_open=shared.fail_open if shared is not None else True,
            machine=machine,
            tokenizers=tokenizers,
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
        if parsed.endpoint in _COUNTS:
            return "", 0, 0  # a prompt count runs no model: a request, no tokens
        encoding = self._encoding(parsed)
        prompt = self._count_prompt(parsed, encoding)
        if parsed.endpoint.endswith("/embeddings"):
            return encoding, prompt, 0
        budget = completion_budget(
            parsed.body, self.default_max_tokens, parsed.endpoint, _prompts(parsed)
        )
        return encoding, prompt, budget

    def prompt_tokens(self, parsed: ParsedRequest, *, exact: bool = False) -> int | None:
        """The request's prompt tokens as admission counts them (the model's own tokenizer
        when [tokenizers] has it, else an estimate; `exact`: None then); its length fields
        are not read."""
        if exact and self._tokenizer(parsed) is None:
            return None
        return self._count_prompt(parsed, self._encoding(parsed))

    def _encoding(self, parsed: ParsedRequest) -> str:
        model = parsed.upstream_model or parsed.model
        encoding = self._encodings.get(model)
        if encoding is None:
            encoding = self._encodings[model] = encoding_for_model(model)
        return encoding

    def _count_prompt(self, parsed: ParsedRequest, encoding: str) -> int:
        exact = self._tokenizer(parsed)
        endpoint, body = parsed.endpoint, parsed.body
        try:
            if endpoint in _VIEWED:
                # Counted as the chat request the server renders it to.
                body = chat_view(parsed.decoded, endpoint == MESSAGES, body)
                endpoint = CHAT
            if exact is not None:
                prompt = exact.count(endpoint, body)
            else:
                prompt = count_request_tokens(body, encoding)
        except (NativeError, msgspec.MsgspecError):
            # A body the request stage accepted but the counter cannot read: estimate, never 500.
            prompt = len(parsed.body) // 4 + 1
        return prompt

    def _tokenizer(self, parsed: ParsedRequest) -> ModelTokenizer | None:
        """The model's own tokenizer ([tokenizers.models]): of the model sent upstream, else
        of the one asked for."""
        return self.tokenizers.get(parsed.upstream_model or parsed.model) or self.tokenizers.get(
            parsed.model
        )

    def text_counter(self, parsed: ParsedRequest) -> Callable[[str], int] | None:
        """The model's own tokenizer's count of a text, if it has one."""
        exact = self._tokenizer(parsed)
        return exact.tokenizer.count if exact is not None else None

    async def admit(self, tenant: Tenant, tokens: int) -> Grant:
        """Reserve one request and `tokens` for the tenant, or raise 429 (503 if fail-closed).

        Never waits on the network: global limits come from the slice this instance holds.
        """
        key = tenant.key_id
        active = self._active.get(key, 0)
        if tenant.max_concurrent is not None and not self._enter(
            key, active, tenant.max_concurrent
        ):
            raise RateLimited(
                f"Too many concurrent requests for tenant {tenant.name!r} "
                f"(limit {tenant.max_concurrent}).",
                code="concurrency_limit_exceeded",
                headers=retry_headers(1.0),
            )
        machine_slot = tenant.max_concurrent is not None and self.machine is not None
        rates = self._rates.get(key)
        if rates is None:
            self._active[key] = active + 1
            return Grant({}, self, tenant, 0, False)
        if tenant.tokens_per_minute is None:
            tokens = 0
        elif tokens > rates.token_capacity:
            if machine_slot:
                self._machine_leave(key)
            raise RateLimited(
                f"Request too large for tenant {tenant.name!r}: it may use {tokens} tokens, "
                f"more than the {int(rates.token_capacity)} one request can ever get. Lower "
                "max_tokens or shorten the prompt.",
                code="request_too_large",
                headers={"x-should-retry": "false"},
            )
        allowed, retry_s, rem_r, rem_t, reset_r, reset_t = self.table.try_acquire(key, tokens)
        if not allowed:
            if machine_slot:
                self._machine_leave(key)
            headers = rate_headers(tenant, rem_r, rem_t, reset_r, reset_t)
            raise self._limited(tenant, retry_s, headers)
        shared = False
        if self.shared is not None:
            verdict = self.shared.take(key, rates, tokens)
            if verdict is None and not self.fail_open:
                self.table.refund(key, requests=1, tokens=tokens)
                if machine_slot:
                    self._machine_leave(key)
                raise Unavailable(
                    "The shared rate-limit store is unreachable; retry shortly.",
                    code="rate_limit_store_unavailable",
                    headers=retry_headers(self.shared.retry_s),
                )
            if verdict is not None:
                ok, wait_s, g_r, g_t, g_reset_r, g_reset_t = verdict
                rem_r, rem_t = min(rem_r, g_r), min(rem_t, g_t)
                reset_r, reset_t = max(reset_r, g_reset_r), max(reset_t, g_reset_t)
                if not ok:
                    self.table.refund(key, requests=1, tokens=tokens)
                    if machine_slot:
                        self._machine_leave(key)
                    headers = rate_headers(tenant, rem_r, rem_t, reset_r, reset_t)
                    raise self._limited(tenant, wait_s, headers)
                shared = True
        self._active[key] = active + 1
        return Grant(
            rate_headers(tenant, rem_r, rem_t, reset_r, reset_t), self, tenant, tokens, shared
        )

    def _enter(self, key: str, active: int, limit: int) -> bool:
        """Whether one more request of `key` may run: on this process, or on the machine."""
        if self.machine is not None:
            return self.machine.enter(key, limit)
        return active < limit

    def _machine_leave(self, key: str) -> None:
        if self.machine is not None:
            self.machine.leave(key)

    def _release(self, key: str, limited: bool = False) -> None:
        if limited:
            self._machine_leave(key)
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
        self._release(tenant.key_id, tenant.max_concurrent is not None)
        rates = self._rates.get(tenant.key_id)
        if used is None or rates is None or tenant.tokens_per_minute is None or used == reserved:
            return
        self.table.reconcile(tenant.key_id, reserved, used)
        if shared and self.shared is not None:
            self.shared.settle(tenant.key_id, reserved, used)

    async def close(self) -> None:
        """Give back leased slices and close the shared store's connections."""
        if self.shared is not None:
            await self.shared.close()


def used_tokens(response: web.StreamResponse, meter: StreamUsage | None) -> int | None:
    """Real usage of an answered request; 0 for an error, None when it is unknown."""
    if response.status >= 400:
        return 0
    if isinstance(response, web.Response):
        body = response.body
        return usage_tokens(body) if isinstance(body, bytes) else None
    return meter.used() if meter is not None else None


def rate_limit_headers(ctx: RequestContext, headers: MutableMapping[str, str]) -> None:
    """A response decorator: the tenant's x-ratelimit-* headers on every answer it gets."""
    grant = ctx.grant
    if grant is not None:
        headers.update(grant.headers)


def _prompts(parsed: ParsedRequest) -> int:
    """How many prompts the request holds: a completions batch (a list of strings or of
    token-id lists) is answered once per prompt."""
    prompt = getattr(parsed.decoded, "prompt", None) if parsed.endpoint == COMPLETIONS else None
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return len(prompt)
    return 1


class Limits:
    """The admission stage after parsing: the key's model permission, then its rate limits."""

    def __init__(self, auth: Authenticator, limiter: Limiter) -> None:
        self.auth = auth
        self.limiter = limiter

    async def admit(self, ctx: RequestContext, headers: Mapping[str, str]) -> None:
        """403 for a model the key may not use; 429 (or 503) over its limits; else a grant."""
        tenant = ctx.tenant
        assert isinstance(tenant, Tenant), "authenticated before admission"
        ctx.timer.record(AUTH, ctx.auth_ns)
        self.auth.authorize_model(tenant, ctx.request.model)
        limiter = self.limiter
        ctx.timer.begin(RATE_LIMIT)
        try:
            encoding, prompt, budget = None, 0, 0
            if tenant.tokens_per_minute:
                encoding, prompt, budget = limiter.estimate_parts(ctx.request)
            grant = await limiter.admit(tenant, prompt + budget)
        finally:
            ctx.timer.end(RATE_LIMIT)
        if ctx.request.stream and encoding is not None:
            # Only a token-limited key settles a stream with its usage.
            grant.meter = StreamUsage(prompt, encoding, limiter.text_counter(ctx.request))
            ctx.meter = grant.meter
        ctx.grant = grant


def auth_preparer(auth: Authenticator, limiter: Limiter) -> Preparer:
    """[auth] on reload: keys added, revoked or re-limited at once; bucket levels kept."""

    def prepare(old: Config, new: Config) -> Commit:
        if new.auth == old.auth:
            return lambda: None
        fresh = Authenticator.reloaded(old.auth, new.auth)

        def commit() -> None:
            for tenant in fresh.tenants:
                limiter.configure(tenant)
            auth.adopt(fresh)

        return commit

    return prepare
