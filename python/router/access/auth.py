"""API keys to tenants: Bearer / x-api-key, SHA-256 hashes in config, constant-time comparison."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.errors import ConfigError, Forbidden, Unauthorized

if TYPE_CHECKING:
    from router.config import ApiKeyConfig, AuthConfig

log = logging.getLogger("router")

ANONYMOUS = "anonymous"
_PREFIX = 2


def hash_key(key: str) -> str:
    """The SHA-256 hex digest config stores for an API key."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a request belongs to and what its key may do."""

    key_id: str  # non-secret, stable id of the key (hash prefix): names buckets and Redis keys
    name: str
    models: frozenset[str] | None  # None: every model
    requests_per_minute: int | None  # None: unlimited
    tokens_per_minute: int | None
    request_burst: int | None  # None: one minute's worth
    token_burst: int | None
    max_concurrent: int | None
    priority: int
    cache_namespace: str

    def allows(self, model: str) -> bool:
        """Whether this key may use `model`."""
        return self.models is None or model in self.models


def tenant_from_config(key: ApiKeyConfig) -> Tenant:
    """The runtime tenant for one `[[auth.keys]]` entry."""
    return Tenant(
        key_id=key.sha256[:16],
        name=key.tenant,
        models=frozenset(key.models) if key.models else None,
        requests_per_minute=key.requests_per_minute,
        tokens_per_minute=key.tokens_per_minute,
        request_burst=key.request_burst,
        token_burst=key.token_burst,
        max_concurrent=key.max_concurrent,
        priority=key.priority,
        cache_namespace=key.cache_namespace or key.tenant,
    )


ANONYMOUS_TENANT = Tenant(
    key_id=ANONYMOUS,
    name=ANONYMOUS,
    models=None,
    requests_per_minute=None,
    tokens_per_minute=None,
    request_burst=None,
    token_burst=None,
    max_concurrent=None,
    priority=0,
    cache_namespace=ANONYMOUS,
)


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key in `Authorization: Bearer ...` or `x-api-key`, if any."""
    scheme, _, value = headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = headers.get("x-api-key", "").strip()
    return key or None


def _digest(key: str) -> bytes:
    # aiohttp hands undecodable header bytes over as surrogates: hash the bytes as sent.
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def _redacted(key: str) -> str:
    # OpenAI shows a hint of the key so a user can tell which one was wrong, never all of it.
    if len(key) >= 12 and key.isascii() and key.isprintable():
        return f"{key[:3]}***{key[-4:]}"
    return "***"


class Authenticator:
    """Maps a request's headers to its Tenant, or refuses it."""

    def __init__(
        self,
        tenants: Iterable[tuple[str, Tenant]],
        *,
        enabled: bool = True,
        admin_token_sha256: str | None = None,
    ) -> None:
        self.enabled = enabled
        # Keys are indexed by a short prefix of their hash, then compared in full in constant
        # time: the lookup's timing depends only on the hash of what the caller sent.
        self._by_prefix: dict[bytes, list[tuple[bytes, Tenant]]] = {}
        self._tenants: list[Tenant] = []
        for digest, tenant in tenants:
            raw = bytes.fromhex(digest)
            if self._lookup(raw) is not None:
                raise ConfigError(f"auth.keys: sha256 {digest[:16]}... is listed twice")
            self._by_prefix.setdefault(raw[:_PREFIX], []).append((raw, tenant))
            self._tenants.append(tenant)
        self._admin = bytes.fromhex(admin_token_sha256) if admin_token_sha256 else None
        if self._admin is not None and self._lookup(self._admin) is not None:
            raise ConfigError("auth.admin_token_sha256: the admin token must not be a tenant key")

    @classmethod
    def from_config(cls, config: AuthConfig) -> Authenticator:
        """Build from the `[auth]` section."""
        return cls(
            ((key.sha256, tenant_from_config(key)) for key in config.keys),
            enabled=config.enabled,
            admin_token_sha256=config.admin_token_sha256,
        )

    @classmethod
    def reloaded(cls, old: AuthConfig, new: AuthConfig) -> Authenticator:
        """The keys a reload from `old` to `new` adopts; ConfigError for what only a restart
        applies (other features built their admin guards and cache namespaces from those)."""
        for field in ("enabled", "admin_token_sha256"):
            if getattr(new, field) != getattr(old, field):
                raise ConfigError(f"field `auth.{field}`: changed; restart the router to apply it")
        return cls.from_config(new)

    def warn_if_disabled(self) -> None:
        """The loud startup WARNING of a router serving without key checks."""
        if not self.enabled:
            log.warning(
                "AUTH IS DISABLED ([auth] enabled = false): every request is served as tenant "
                "%r without any key check; use this only for local development",
                ANONYMOUS,
            )

    def adopt(self, other: Authenticator) -> None:
        """Take another authenticator's keys in one step (a config reload's commit)."""
        self._by_prefix, self._tenants = other._by_prefix, other._tenants

    @property
    def tenants(self) -> list[Tenant]:
        """Every configured tenant key (the anonymous one too when auth is off)."""
        return list(self._tenants) if self.enabled else [*self._tenants, ANONYMOUS_TENANT]

    def _lookup(self, digest: bytes) -> Tenant | None:
        found = None
        for stored, tenant in self._by_prefix.get(digest[:_PREFIX], ()):
            if hmac.compare_digest(stored, digest):
                found = tenant
        return found

    def authenticate(self, headers: Mapping[str, str]) -> Tenant:
        """The tenant of the request's key; 401 when it is missing or unknown."""
        if not self.enabled:
            return ANONYMOUS_TENANT
        key = presented_key(headers)
        if key is None:
            raise Unauthorized(
                "You didn't provide an API key. Provide it as 'Authorization: Bearer YOUR_KEY' "
                "or in the 'x-api-key' header.",
                code="missing_api_key",
            )
        tenant = self._lookup(_digest(key))
        if tenant is None:
            raise Unauthorized(f"Incorrect API key provided: {_redacted(key)}.")
        return tenant

    def authorize_model(self, tenant: Tenant, model: str) -> None:
        """403 when the tenant's key may not use `model`."""
        if not tenant.allows(model):
            raise Forbidden(
                f"The API key of tenant {tenant.name!r} is not allowed to use model {model!r}.",
                param="model",
            )

    def check_admin(self, headers: Mapping[str, str]) -> None:
        """Accept only the admin token: 401 without a valid token, 403 for a tenant key."""
        key = presented_key(headers)
        if key is None:
            raise Unauthorized("The admin API needs the admin token.", code="missing_api_key")
        digest = _digest(key)
        if self._admin is not None and hmac.compare_digest(digest, self._admin):
            return
        if self._lookup(digest) is not None:
            raise Forbidden("Tenant keys cannot use the admin API.", code="admin_only")
        raise Unauthorized(f"Incorrect admin token provided: {_redacted(key)}.")
