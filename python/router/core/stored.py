"""A stored Responses API response, asked for again: retrieved, deleted, cancelled, its input
items listed, each at the one region that holds it.

`GET /v1/responses/{id}` (with `?stream=true`: the background stream), `DELETE
/v1/responses/{id}`, `POST /v1/responses/{id}/cancel` and `GET /v1/responses/{id}/input_items`
go to the region the router saw make the response, for the tenant that made it; any other id is
a 404 (no other region has it to ask). A whole answer is read whole (identity-encoded, within the
size limit, the region's key blanked from error bodies) before it is sent, so a region that
breaks off is a clean 502; an event stream is relayed whole event by event (core.relay), and one
the region cuts, stalls or overgrows ends with `response.failed`, never looking complete.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from router.config import Config
from router.core.attempt import check_identity, media_type, read_capped, unrelayable
from router.core.context import RequestContext
from router.core.failure import AttemptError
from router.core.relay import relay_stream
from router.core.request import read_body
from router.core.responses import region_error
from router.core.stages import StateHomes
from router.core.transport import UpstreamResponse
from router.core.upstream import Opened, Upstreams
from router.errors import NotFound, UpstreamError
from router.net import http1

log = logging.getLogger("router")
# A cancel's body is empty or tiny; anything bigger is not one (413).
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
        body = await read_body(request, _MAX_BODY, config.server.body_timeout_s)
    path = upstream.path(request.path)
    if request.query_string:
        path += "?" + request.query_string
    headers = upstream.request_headers(request.headers, ctx.request_id)
    max_bytes = config.server.max_response_bytes
    answer: UpstreamResponse | None = None
    # One deadline for the whole read of a whole answer, counted from the send.
    total = asyncio.get_running_loop().time() + config.timeouts.total
    try:
        async with asyncio.timeout(config.timeouts.first_byte):
            answer = await upstream.pool.post(path, body, headers.items(), request.method.encode())
            headers_out = upstream.response_headers(answer.headers)
            streamed = answer.status == 200 and media_type(headers_out) == "text/event-stream"
            first = await answer.content.readany() if streamed else b""
            check_identity(upstream.name, headers_out)
        if not streamed:
            async with asyncio.timeout_at(total):
                whole = await read_capped(answer, upstream.name, max_bytes)
    except (TimeoutError, http1.ClientError, AttemptError) as exc:
        # The detail (it may name the region's host) stays in the log.
        log.warning("request %s: stored response at %s: %r", ctx.request_id, upstream.name, exc)
        if answer is not None:
            answer.close()
        timeout = isinstance(exc, TimeoutError)
        how = (
            "did not answer in time"
            if timeout
            else "answered with an unusable body"
            if isinstance(exc, AttemptError)
            else "did not answer"
        )
        raise UpstreamError(
            f"Region `{upstream.name}`, which holds the response, {how}.",
            status=504 if timeout else 502,
            code="upstream_timeout" if timeout else "upstream_error",
        ) from None
    except BaseException:
        # The client left (or anything else): the region's connection is not reused.
        if answer is not None:
            answer.close()
        raise
    if streamed:
        opened = Opened(upstream, answer.status, headers_out, response=answer, first=first)
        return await relay_stream(
            request,
            ctx,
            opened,
            config.timeouts.idle,
            max_bytes=max_bytes,
            max_event_bytes=config.server.max_event_bytes,
        )
    answer.release()
    why = unrelayable(answer.status)
    if why is not None:
        # The same answers the attempt path never relays.
        log.warning(
            "request %s: stored response at %s: HTTP %d: %s",
            ctx.request_id,
            upstream.name,
            answer.status,
            why,
        )
        raise UpstreamError(
            f"Region `{upstream.name}`, which holds the response, answered with an unusable "
            "status.",
            code="upstream_error",
        )
    whole = upstream.scrub(whole)
    if answer.status >= 400:
        # An API error is relayed; a load balancer's page naming its hosts is not.
        return region_error(answer.status, headers_out, whole, ctx.request_id)
    headers_out["X-Request-Id"] = ctx.request_id
    return web.Response(status=answer.status, body=whole, headers=headers_out)
