"""Admin endpoints of the rollout: the table, weight changes, instant rollback, config reload."""

from __future__ import annotations

import logging
from typing import TypeVar

import msgspec
from aiohttp import web

from router.core.admin import AdminRoutes, json_response
from router.errors import InvalidRequest
from router.rollout.canary import WindowStats
from router.rollout.runtime import ROLLOUT
from router.rollout.table import describe

log = logging.getLogger("router")


class WeightsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of POST /admin/rollout/weights: versions not named keep their weight."""

    model: str
    weights: dict[str, float]


class RollbackRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of POST /admin/rollout/rollback: everyone to `to` (default the stable version)."""

    model: str
    to: str | None = None


T = TypeVar("T")


def _decode(raw: bytes, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.MsgspecError as exc:
        raise InvalidRequest(f"Invalid admin request: {exc}") from None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _stats(w: WindowStats) -> dict[str, object]:
    return {
        "samples": w.samples,
        "errors": w.errors,
        "error_rate": w.error_rate,
        "ttft_p95_ms": _ms(w.ttft_p95),  # streams
        "whole_p95_ms": _ms(w.whole_p95),  # whole answers
    }


async def table(request: web.Request) -> web.Response:
    """GET: every alias with its deployments, weights, stable version and canary window stats."""
    runtime = request.app[ROLLOUT]
    current = runtime.rollout.table
    payload = describe(current)
    tracker = runtime.canary.tracker
    payload["window"] = {
        alias.name: {
            d.version: _stats(tracker.stats(alias.name, d.version)) for d in alias.deployments
        }
        for alias in current.aliases.values()
        if len(alias.deployments) > 1
    }
    payload["auto_rollback"] = runtime.canary.policy.auto_rollback
    return json_response(payload)


async def weights(request: web.Request) -> web.Response:
    """POST {"model", "weights": {version: weight}}: takes effect on the next request."""
    body = _decode(await request.read(), WeightsRequest)
    new = request.app[ROLLOUT].rollout.set_weights(body.model, body.weights)
    log.warning(
        "admin: model %s weights now %s (table generation %d)",
        body.model,
        new.alias(body.model).weights(),
        new.generation,
    )
    return json_response(describe(new))


async def rollback(request: web.Request) -> web.Response:
    """POST {"model", "to"?}: all traffic to the stable version now; the others stay deployed."""
    body = _decode(await request.read(), RollbackRequest)
    new = request.app[ROLLOUT].rollout.rollback(body.model, body.to)
    alias = new.alias(body.model)
    log.warning(
        "admin rollback: model %s -> version %s (table generation %d)",
        body.model,
        body.to if body.to is not None else alias.stable,
        new.generation,
    )
    return json_response(describe(new))


def add_routes(routes: AdminRoutes) -> None:
    """The rollout endpoints, behind the admin guard."""
    routes.get("/rollout", table)
    routes.post("/rollout/weights", weights)
    routes.post("/rollout/rollback", rollback)
