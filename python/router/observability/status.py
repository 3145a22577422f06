"""The live status page: `/status` (HTML, polls) and its JSON feed `/status.json`."""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.resources import files
from typing import Any

import msgspec
from aiohttp import web

from router.observability.metrics import RegionState, Telemetry
from router.observability.quantiles import OVERALL
from router.observability.region_attempts import AttemptTotals
from router.observability.slo import SloStatus

_PAGE = files("router").joinpath("static/status.html")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _slo_fields(st: SloStatus) -> dict[str, Any]:
    return {
        "requests": st.requests,
        "errors": st.errors,
        "error_rate": st.error_rate,
        "ttft_p50_ms": _ms(st.ttft_p50_s),
        "ttft_p95_ms": _ms(st.ttft_p95_s),
        "ttft_p99_ms": _ms(st.ttft_p99_s),
        "ttft_ok": st.ttft_ok,
        "errors_ok": st.errors_ok,
    }


def _region(
    state: RegionState | None, name: str, st: SloStatus, tried: AttemptTotals, target: float
) -> dict[str, Any]:
    rate = tried.error_rate
    return {
        "name": name,
        # A region the health snapshot does not know about is reported, not guessed at.
        "healthy": None if state is None else state.healthy,
        "rtt_ms": None if state is None else _ms(state.rtt_s),
        "in_flight": 0 if state is None else state.in_flight,
        "queue_depth": 0 if state is None else state.queue_depth,
        "ejections": 0 if state is None else state.ejections,
        # requests: those the region answered in the end; TTFT: the client's, of those.
        **_slo_fields(st),
        # A region's errors are its attempts': one that failed an attempt another region then
        # served still failed it. The router's own refusals (admission full here: `shed`) are
        # none of its errors.
        "attempts": tried.attempts,
        "errors": tried.errors,
        "error_rate": rate,
        "errors_ok": rate is None or rate <= target,
        "shed": tried.shed,
    }


def feed(telemetry: Telemetry, now: float, wall: float) -> dict[str, Any]:
    """The status document at monotonic time `now` (rolling windows) and wall time `wall`."""
    slo = telemetry.slo
    states = {s.region: s for s in telemetry.regions()} if telemetry.regions else {}
    # Read the counters directly: a registry lookup would render every metric family first.
    m = telemetry.metrics
    tried = m.attempts
    seen = dict.fromkeys([*states, *slo.names(), *tried.names()])
    names = [k for k in seen if k != OVERALL]
    hits, misses = m.cache_hits, m.cache_misses
    lookups = hits + misses
    return {
        "ts": round(wall, 3),
        "slo": {
            "ttft_p95_target_ms": _ms(slo.targets.ttft_p95_s),
            "error_rate_target": slo.targets.error_rate,
            "window_s": slo.targets.window_s,
        },
        "overall": _slo_fields(slo.status(OVERALL, now)),
        "cache": {
            "hits": hits,
            "misses": misses,
            "hit_ratio": hits / lookups if lookups else None,
        },
        "rate_limited": m.rate_limited,
        "regions": [
            _region(
                states.get(n), n, slo.status(n, now), tried.totals(n, now), slo.targets.error_rate
            )
            for n in names
        ],
    }


_encode = msgspec.json.Encoder().encode


def add_routes(
    app: web.Application,
    telemetry: Telemetry,
    *,
    refresh_ms: int = 1000,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Serve `/status` and `/status.json` from `telemetry`."""
    page = _PAGE.read_text(encoding="utf-8").replace("__REFRESH_MS__", str(int(refresh_ms)))

    async def status_page(request: web.Request) -> web.Response:
        return web.Response(
            text=page,
            content_type="text/html",
            headers={"Cache-Control": "no-store", "Content-Security-Policy": _CSP},
        )

    async def status_json(request: web.Request) -> web.Response:
        body = _encode(feed(telemetry, clock(), time.time()))
        return web.Response(
            body=body, content_type="application/json", headers={"Cache-Control": "no-store"}
        )

    app.router.add_get("/status", status_page)
    app.router.add_get("/status.json", status_json)


# The page is self-contained: inline script and style only, nothing fetched from elsewhere.
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:"
)
