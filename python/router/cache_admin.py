"""Admin endpoints of the response cache: stats, and purge by tenant / model / all."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

import msgspec
from aiohttp import web

from router.cache_tiers import ResponseCache
from router.config import AuthConfig
from router.errors import ApiError, InvalidRequest

CACHE = web.AppKey("router.cache", ResponseCache)
# Tenant name -> the cache namespaces its keys use (a tenant's default namespace is its name).
NAMESPACES = web.AppKey("router.cache.namespaces", Mapping[str, frozenset[str]])


class PurgeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of POST /admin/cache/purge; no field means everything."""

    tenant: str | None = None
    namespace: str | None = None
    model: str | None = None


_PURGE = msgspec.json.Decoder(PurgeRequest)


def _json(payload: object, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(payload), status=status, content_type="application/json"
    )


def _error(error: ApiError) -> web.Response:
    return web.Response(body=error.body(), status=error.status, content_type="application/json")


async def stats(request: web.Request) -> web.Response:
    """GET: entries, bytes, hit ratio and counters."""
    return _json(request.app[CACHE].stats())


async def purge(request: web.Request) -> web.Response:
    """POST {"tenant"?, "namespace"?, "model"?}: drop matching entries from both tiers."""
    raw = await request.read()
    try:
        body = _PURGE.decode(raw) if raw.strip() else PurgeRequest()
    except msgspec.MsgspecError as exc:
        return _error(InvalidRequest(f"Invalid purge request: {exc}"))
    if body.tenant is not None and body.namespace is not None:
        return _error(InvalidRequest("Give `tenant` or `namespace`, not both.", param="tenant"))
    cache = request.app[CACHE]
    namespaces: Sequence[str | None] = [body.namespace]
    if body.tenant is not None:
        known = request.app.get(NAMESPACES, {})
        namespaces = sorted(known.get(body.tenant, frozenset({body.tenant})))
    purged = 0
    for ns in namespaces:
        purged += await cache.purge(namespace=ns, model=body.model)
    return _json({"purged": purged})


Handler = Callable[[web.Request], Awaitable[web.Response]]
# Raises an ApiError unless the headers carry admin credentials (auth.Authenticator.check_admin).
Guard = Callable[[Mapping[str, str]], None]


def _guarded(handler: Handler, guard: Guard) -> Handler:
    async def checked(request: web.Request) -> web.Response:
        try:
            guard(request.headers)
        except ApiError as exc:
            return _error(exc)
        return await handler(request)

    return checked


def namespaces_of(auth: AuthConfig) -> dict[str, frozenset[str]]:
    """Tenant name -> the cache namespaces of its keys."""
    out: dict[str, set[str]] = {}
    for key in auth.keys:
        out.setdefault(key.tenant, set()).add(key.cache_namespace or key.tenant)
    return {tenant: frozenset(ns) for tenant, ns in out.items()}


def add_routes(router: web.UrlDispatcher, guard: Guard, prefix: str = "/admin/cache") -> None:
    """Register GET {prefix}/stats and POST {prefix}/purge, each behind `guard`."""
    router.add_get(f"{prefix}/stats", _guarded(stats, guard))
    router.add_post(f"{prefix}/purge", _guarded(purge, guard))
