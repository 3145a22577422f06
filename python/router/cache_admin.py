"""Admin endpoints of the response cache: stats, and purge by tenant / model / all."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
from aiohttp import web

from router.cache_tiers import ResponseCache
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


def add_routes(app: web.Application, prefix: str = "/admin/cache") -> None:
    """Register the cache admin routes on `app` (the admin listener or the main app)."""
    app.router.add_get(f"{prefix}/stats", stats)
    app.router.add_post(f"{prefix}/purge", purge)
