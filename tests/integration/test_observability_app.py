"""The observability wiring on a small real aiohttp app: answers survive a broken access log."""

from __future__ import annotations

import io
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from router.config import ObservabilityConfig
from router.core.context import RequestContext
from router.observability import telemetry as observability
from router.observability.access_log import AccessLog, AccessRecord

CONTEXT: web.RequestKey[RequestContext] = web.RequestKey("test.context")


class BrokenLog(AccessLog):
    """What the direct stdout write does when stdout is gone (pytest reroutes it otherwise)."""

    def emit(self, record: AccessRecord) -> None:
        raise BrokenPipeError("stdout went away")


async def handler(request: web.Request) -> web.Response:
    ctx = RequestContext("rid-1", "/v1/chat/completions")
    request[CONTEXT] = ctx
    ctx.timer.record("parse", 1000)
    return web.json_response({"ok": True})


async def test_a_failing_access_log_never_costs_the_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = web.Application()
    telemetry = observability.install(
        app,
        ObservabilityConfig(),
        context_of=lambda request: request.get(CONTEXT),
        hooks=[],
        region_names=["a"],
    )
    assert telemetry is not None
    telemetry.log = BrokenLog(stream=io.StringIO())
    app.router.add_post("/v1/chat/completions", handler)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        with caplog.at_level(logging.ERROR, logger="router"):
            for _ in range(3):
                resp = await client.post("/v1/chat/completions", json={})
                assert resp.status == 200
                assert await resp.json() == {"ok": True}
                assert resp.headers["Server-Timing"].startswith("parse;dur=0.001")
                assert resp.headers["X-Request-Id"] == "rid-1"
        # Metrics still counted every request; the failure was logged once, not per request.
        assert telemetry.metrics.registry.get_sample_value(
            "router_requests_total",
            {"region": "none", "model": "none", "status": "200", "cache": "none"},
        ) == 3  # fmt: skip
        failures = [r for r in caplog.records if "could not record" in r.getMessage()]
        assert len(failures) == 1
    telemetry.log.close()


async def test_disabled_installs_nothing() -> None:
    app = web.Application()
    assert (
        observability.install(
            app,
            ObservabilityConfig(enabled=False),
            context_of=lambda request: None,
            hooks=[],
            region_names=["a"],
        )
        is None
    )

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="x")

    app.router.add_get("/x", plain)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.get("/x")
        assert "Server-Timing" not in resp.headers
        assert (await client.get("/metrics")).status == 404
