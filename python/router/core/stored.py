"""A stored Responses API response, asked for again: retrieved, deleted, cancelled, its input
items listed, each at the one region that holds it.

`GET /v1/responses/{id}` (with `?stream=true`: the background stream, relayed as it comes),
`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel` and
`GET /v1/responses/{id}/input_items` go to the region the router saw make the response, for the
tenant that made it; any other id is a 404 (no other region has it to ask).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from router.config import Config
from router.core.context import RequestContext
from router.core.stages import StateHomes
from router.core.upstream import Upstreams, response_headers
from router.errors import NotFound, UpstreamError
from router.net import http1
from router.net.stream_response import StreamResponse

log = logging.getLogger("router")
# A cancel's body is empty or tiny; anything bigger is not one.
_MAX_BODY = 64 << 10


async def forward_stored(
    request: web.Request,
    ctx: RequestContext,
    homes: StateHomes,
    upstreams: Upstreams,
    config: Config,
) -> web.StreamResponse:
    """Relay one stored-response call to the region holding the response."""
    response_id = request.match_info["id"]
    home = await homes.home(response_id, ctx.owner)
    upstream = upstreams.get(home) if home is not None else None
    if upstream is None:
        raise NotFound(
            f"Response `{response_id}` is not known to this router.",
            param="response_id",
            code="response_not_found",
        )
    ctx.region = upstream.name
    ctx.attempts = 1
    body = b""
    if request.method == "POST":
        body = await request.content.read(_MAX_BODY)
    path = upstream.path(request.path)
    if request.query_string:
        path += "?" + request.query_string
    headers = upstream.request_headers(request.headers, ctx.request_id)
    try:
        async with asyncio.timeout(config.timeouts.first_byte):
            answer = await upstream.pool.post(path, body, headers.items(), request.method.encode())
    except (TimeoutError, http1.ClientError) as exc:
        # The detail (it may name the region's host) stays in the log.
        log.warning("request %s: stored response at %s: %r", ctx.request_id, upstream.name, exc)
        timeout = isinstance(exc, TimeoutError)
        raise UpstreamError(
            f"Region `{upstream.name}`, which holds the response, did not answer.",
            status=504 if timeout else 502,
            code="upstream_timeout" if timeout else "upstream_error",
        ) from None
    out = StreamResponse(status=answer.status, headers=response_headers(answer.headers))
    out.headers["X-Request-Id"] = ctx.request_id
    complete = False
    try:
        await out.prepare(request)
        while chunk := await answer.content.readany():
            await out.write(chunk)
        complete = True
    except (http1.ClientError, ConnectionResetError):
        pass  # either side left: what was relayed stands, the connection is not reused
    finally:
        if complete:
            answer.release()
        else:
            answer.close()
    await out.write_eof()
    return out
