"""Admin routes behind the admin check: `AdminRoutes(router, guard).get(path, fn)` puts `fn`
behind the guard and renders any ApiError it raises in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from aiohttp import web

from router.errors import ApiError

# Raises an ApiError (401 without a valid admin token, 403 for a tenant key) or returns.
Guard = Callable[[Mapping[str, str]], None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
