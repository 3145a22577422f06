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


_ACTIONS = {
    "drain": AdminState.DRAINED,
    "disable": AdminState.DISABLED,
    "enable": AdminState.ACTIVE,
}


def admin_change(method: str, path: str) -> tuple[str, AdminState] | None:
    """The region and setting an admin call changes (POST /admin/regions/{name}/{action}),
    for the supervisor to keep for the machine; None for any other call."""
    if method != "POST":
        return None
    parts = path.split("?", 1)[0].split("/")
    if len(parts) != 5 or parts[:3] != ["", "admin", "regions"] or parts[4] not in _ACTIONS:
        return None
    return parts[3], _ACTIONS[parts[4]]


def add_routes(routes: AdminRoutes) -> None:
    """The health and region admin endpoints; the app must hold a Health under HEALTH."""
    routes.get("/health", health_view)
    for action, state in _ACTIONS.items():
        routes.post(f"/regions/{{name}}/{action}", _set_state(state))
