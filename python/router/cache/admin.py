"""Admin endpoints of the response cache: stats, and purge by tenant / model / all."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec
from aiohttp import web

from router.cache.tiers import ResponseCache
from router.config import AuthConfig
from router.core.admin import AdminRoutes, json_response
from router.errors import InvalidRequest

CACHE = web.AppKey("router.cache", ResponseCache)
# Tenant name -> the cache namespaces its keys use (a tenant's default namespace is its name).
NAMESPACES = web.AppKey("router.cache.namespaces", Mapping[str, frozenset[str]])
# A client-facing model name -> the upstream models it stands for now (the live config's): an
# entry is its upstream model's (the key is the body the region gets), whichever name asked.
MODELS: web.AppKey[Callable[[str], frozenset[str]]] = web.AppKey("router.cache.models")


class PurgeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of POST /admin/cache/purge; no field means everything."""

    tenant: str | None = None
    namespace: str | None = None
    model: str | None = None


_PURGE = msgspec.json.Decoder(PurgeRequest)


async def stats(request: web.Request) -> web.StreamResponse:
    """GET: entries, bytes, hit ratio and counters."""
    return json_response(request.app[CACHE].stats())


async def purge(request: web.Request) -> web.StreamResponse:
    """POST {"tenant"?, "namespace"?, "model"?}: drop matching entries from both tiers (a
    model given by a client-facing name: the entries of every upstream model it stands for)."""
    raw = await request.read()
    try:
        body = _PURGE.decode(raw) if raw.strip() else PurgeRequest()
    except msgspec.MsgspecError as exc:
        raise InvalidRequest(f"Invalid purge request: {exc}") from exc
    if body.tenant is not None and body.namespace is not None:
        raise InvalidRequest("Give `tenant` or `namespace`, not both.", param="tenant")
    cache = request.app[CACHE]
    namespaces: Sequence[str | None] = [body.namespace]
    if body.tenant is not None:
        known = request.app.get(NAMESPACES, {})
        namespaces = sorted(known.get(body.tenant, frozenset({body.tenant})))
    models: Sequence[str | None] = [body.model]
    if body.model is not None:
        # The name itself (an upstream model) and the models it stands for (an alias's, or a
        # rollout's versions').
        stands_for = request.app.get(MODELS)
        more = stands_for(body.model) if stands_for is not None else frozenset()
        models = sorted({body.model, *more})
    purged = 0
    for ns in namespaces:
        for model in models:
            purged += await cache.purge(namespace=ns, model=model)
    return json_response({"purged": purged})


def namespaces_of(auth: AuthConfig) -> dict[str, frozenset[str]]:
    """Tenant name -> the cache namespaces of its keys."""
    out: dict[str, set[str]] = {}
    for key in auth.keys:
        out.setdefault(key.tenant, set()).add(key.cache_namespace or key.tenant)
    return {tenant: frozenset(ns) for tenant, ns in out.items()}


def add_routes(routes: AdminRoutes) -> None:
    """GET /cache/stats and POST /cache/purge under the admin prefix, behind its guard."""
    routes.get("/cache/stats", stats)
    routes.post("/cache/purge", purge)
