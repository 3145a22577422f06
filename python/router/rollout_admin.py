"""Admin endpoints of the rollout: the table, weight changes, instant rollback, config reload."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import msgspec
from aiohttp import web

from router.errors import ApiError, InvalidRequest
from router.reload import RELOADER
from router.rollout import describe
from router.rollout_web import ROLLOUT


class WeightsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of POST /admin/rollout/weights: versions not named keep their weight."""

    model: str
    weights: dict[str, float]


class RollbackRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of POST /admin/rollout/rollback: everyone to `to` (default the stable version)."""

    model: str
    to: str | None = None


def _json(payload: object, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(payload), status=status, content_type="application/json"
    )


def _error(error: ApiError) -> web.Response:
    return web.Response(body=error.body(), status=error.status, content_type="application/json")


T = TypeVar("T")


def _decode(raw: bytes, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.MsgspecError as exc:
        raise InvalidRequest(f"Invalid admin request: {exc}") from None


async def table(request: web.Request) -> web.Response:
    """GET: every alias with its deployments, weights and stable version."""
    return _json(describe(request.app[ROLLOUT].rollout.table))


async def weights(request: web.Request) -> web.Response:
    """POST {"model", "weights": {version: weight}}: takes effect on the next request."""
    try:
        body = _decode(await request.read(), WeightsRequest)
        new = request.app[ROLLOUT].rollout.set_weights(body.model, body.weights)
    except ApiError as exc:
        return _error(exc)
    return _json(describe(new))


async def rollback(request: web.Request) -> web.Response:
    """POST {"model", "to"?}: all traffic to the stable version now; the others stay deployed."""
    try:
        body = _decode(await request.read(), RollbackRequest)
        new = request.app[ROLLOUT].rollout.rollback(body.model, body.to)
    except ApiError as exc:
        return _error(exc)
    return _json(describe(new))


async def reload(request: web.Request) -> web.Response:
    """POST: reload the config file; 400 naming file and field if the new one is invalid."""
    result = request.app[RELOADER].reload()
    if not result.applied:
        return _error(InvalidRequest(result.message, code="invalid_config"))
    return _json({"status": "applied", "generation": result.generation, "message": result.message})


# Raises an ApiError (401/403) unless the headers carry the admin token.
Guard = Callable[[Mapping[str, str]], None]
Handler = Callable[[web.Request], Awaitable[web.Response]]


def _guarded(handler: Handler, guard: Guard) -> Handler:
    async def checked(request: web.Request) -> web.Response:
        try:
            guard(request.headers)
        except ApiError as exc:
            return _error(exc)
        return await handler(request)

    return checked


def add_routes(router: web.UrlDispatcher, guard: Guard, prefix: str = "/admin") -> None:
    """Register the rollout and reload endpoints, each behind `guard`."""
    router.add_get(f"{prefix}/rollout", _guarded(table, guard))
    router.add_post(f"{prefix}/rollout/weights", _guarded(weights, guard))
    router.add_post(f"{prefix}/rollout/rollback", _guarded(rollback, guard))
    router.add_post(f"{prefix}/reload", _guarded(reload, guard))
