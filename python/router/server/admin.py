"""Admin API on the admin token: region drain/disable/enable and the health view.

Other features register their routes the same way: `AdminRoutes(router, guard).get(path, fn)`
puts `fn` behind the admin check and renders any ApiError it raises in OpenAI's shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from aiohttp import web

from router.errors import ApiError, NotFound
from router.routing.health import Health
from router.routing.selection import AdminState

# Raises an ApiError (401 without a valid admin token, 403 for a tenant key) or returns.
Guard = Callable[[Mapping[str, str]], None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HEALTH: web.AppKey[Health] = web.AppKey("router.health", Health)


def json_response(payload: Any, status: int = 200) -> web.Response:
    """A JSON answer encoded by msgspec."""
    return web.Response(
        body=msgspec.json.encode(payload), status=status, content_type="application/json"
    )


def error_response(error: ApiError) -> web.Response:
    """An ApiError in OpenAI's shape."""
    return web.Response(
        body=error.body(),
        status=error.status,
        content_type="application/json",
        headers=error.headers,
    )


class AdminRoutes:
    """Registers handlers under `prefix`, each behind `guard`."""

    def __init__(self, router: web.UrlDispatcher, guard: Guard, prefix: str = "/admin") -> None:
        self.router = router
        self.guard = guard
        self.prefix = prefix.rstrip("/")

    def _wrap(self, handler: Handler) -> Handler:
        guard = self.guard

        async def checked(request: web.Request) -> web.StreamResponse:
            try:
                guard(request.headers)
                return await handler(request)
            except ApiError as exc:
                return error_response(exc)

        return checked

    def get(self, path: str, handler: Handler) -> None:
        """GET prefix+path -> handler, admin only."""
        self.router.add_get(self.prefix + path, self._wrap(handler))

    def post(self, path: str, handler: Handler) -> None:
        """POST prefix+path -> handler, admin only."""
        self.router.add_post(self.prefix + path, self._wrap(handler))


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
