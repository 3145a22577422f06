"""The proxied endpoints' dispatch without aiohttp's per-request resolve and middleware chain.

aiohttp's `Application._handle` resolves each request's route, builds a frozen match info and
runs the middleware chain. For a POST to one of the forwarded endpoints, the route is always the
same one: `install` gives the app a dispatcher that hands such a request its endpoint's match
info (made once) and calls the error middleware around the endpoint's handler directly, as the
chain would. Everything else (other methods and paths, a query string or escaped path, an
`Expect` header, an app with more middlewares than the error one) takes aiohttp's own path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractRoute, UrlMappingMatchInfo

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def install(app: web.Application, routes: Mapping[str, AbstractRoute], errors: Middleware) -> None:
    """Dispatch POSTs to `routes` (path -> its route in `app`) through `errors`, the app's only
    middleware, without aiohttp's resolve; anything else as aiohttp would. With other
    middlewares (tracing's), nothing changes: every request takes aiohttp's path."""
    if list(app.middlewares) != [errors]:
        return
    slow = app._handle
    table: dict[str, tuple[UrlMappingMatchInfo, Handler]] = {}
    for path, route in routes.items():
        # What resolve would build for this route, shared: frozen, no match values, and the
        # current app already `app` (aiohttp's middleware that sets it is not run here).
        info = UrlMappingMatchInfo({}, route)
        info.add_app(app)
        info.freeze()
        table[path] = (info, route.handler)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        found = table.get(request.raw_path) if request.method == "POST" else None
        if found is None or "Expect" in request.headers:
            return await slow(request)
        info, handler = found
        request._match_info = info
        return await errors(request, handler)

    # An instance attribute: the runner, made after this, serves through it.
    app._handle = dispatch  # type: ignore[method-assign]
