"""Admin API of the regions: drain/disable/enable and the health view (admin token)."""

from __future__ import annotations

from aiohttp import web

from router.core.admin import AdminRoutes, Handler, json_response
from router.errors import NotFound
from router.routing.health import Health
from router.routing.selection import AdminState

HEALTH: web.AppKey[Health] = web.AppKey("router.health", Health)


async def health_view(request: web.Request) -> web.StreamResponse:
    """GET /admin/health: every region's probe, passive and admin state."""
    return json_response(request.app[HEALTH].stats())


def _set_state(state: AdminState) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        health = request.app[HEALTH]
        if not health.set_admin(name, state):
            raise NotFound(f"Unknown region {name!r}.", param="name", code="unknown_region")
        return json_response(
            {"region": name, "admin": state.value, "in_flight": health.in_flight_of(name)}
        )

    return handler


def add_routes(routes: AdminRoutes) -> None:
    """The health and region admin endpoints; the app must hold a Health under HEALTH."""
    routes.get("/health", health_view)
    routes.post("/regions/{name}/drain", _set_state(AdminState.DRAINED))
    routes.post("/regions/{name}/disable", _set_state(AdminState.DISABLED))
    routes.post("/regions/{name}/enable", _set_state(AdminState.ACTIVE))
