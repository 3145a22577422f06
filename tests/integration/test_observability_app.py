"""The observability wiring on the real pipeline, in process: answers survive a broken log."""

from __future__ import annotations

import io
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from router.config import Config, ObservabilityConfig, RegionConfig
from router.core.pipeline import Features, Pipeline
from router.core.request import CHAT
from router.core.transport import LocalReply, LocalTransport
from router.core.upstream import Upstream, Upstreams
from router.observability import telemetry as observability
from router.observability.access_log import AccessLog, AccessRecord
from router.server.pools import RegionPools
from router.server.reload import LiveConfig

REGION = RegionConfig(name="a", base_url="http://127.0.0.1:9/v1", models=("m",))
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
JSON = {"Content-Type": "application/json"}


class BrokenLog(AccessLog):
    """What the direct stdout write does when stdout is gone (pytest reroutes it otherwise)."""

    def emit(self, record: AccessRecord) -> None:
        raise BrokenPipeError("stdout went away")


async def answer(path: str, body: bytes, headers: CIMultiDict[str]) -> LocalReply:
    return LocalReply(200, {"Content-Type": "application/json"}, [b'{"ok":true}'])


def app_with(observer: observability.Observer | None) -> web.Application:
    """The pipeline (no other feature) in front of one in-process region."""
    config = Config(regions=(REGION,))
    pools = RegionPools(Upstreams([Upstream(REGION, LocalTransport(answer), None)]))
    observers = (observer.attempt,) if observer is not None else ()
    pipeline = Pipeline(Features(observers=observers, exchange=observer), LiveConfig(config), pools)
    app = web.Application()
    app.on_response_prepare.append(pipeline.on_prepare)
    app.router.add_post(CHAT, pipeline.handler(CHAT))
    return app


async def test_a_failing_access_log_never_costs_the_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    observer = observability.build(ObservabilityConfig(), ["a"])
    assert observer is not None
    telemetry = observer.telemetry
    telemetry.log = BrokenLog(stream=io.StringIO())
    async with TestClient(TestServer(app_with(observer), host="127.0.0.1")) as client:
        with caplog.at_level(logging.ERROR, logger="router"):
            for _ in range(3):
                resp = await client.post(CHAT, json=BODY, headers={"X-Request-Id": "rid-1"})
                assert resp.status == 200
                assert await resp.json() == {"ok": True}
                assert resp.headers["Server-Timing"].startswith("parse;dur=")
                assert resp.headers["X-Request-Id"] == "rid-1"
        # Metrics still counted every request; the failure was logged once, not per request.
        assert telemetry.metrics.registry.get_sample_value(
            "router_requests_total",
            {"region": "a", "model": "m", "status": "200", "cache": "none"},
        ) == 3  # fmt: skip
        failures = [r for r in caplog.records if "could not record" in r.getMessage()]
        assert len(failures) == 1
    telemetry.log.close()


async def test_disabled_builds_nothing() -> None:
    assert observability.build(ObservabilityConfig(enabled=False), ["a"]) is None
    async with TestClient(TestServer(app_with(None), host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=BODY)
        assert resp.status == 200
        assert "Server-Timing" not in resp.headers
        assert (await client.get("/metrics")).status == 404


async def test_a_request_failing_inside_a_stage_still_shows_that_stage() -> None:
    observer = observability.build(ObservabilityConfig(), ["a"])
    assert observer is not None
    records: list[AccessRecord] = []

    class Kept(AccessLog):
        def emit(self, record: AccessRecord) -> None:
            records.append(record)

    observer.telemetry.log = Kept(stream=io.StringIO())
    async with TestClient(TestServer(app_with(observer), host="127.0.0.1")) as client:
        # A body that does not decode fails inside the parse stage.
        resp = await client.post(
            CHAT, data=b"\x1f\x8b not gzip", headers={"Content-Encoding": "gzip", **JSON}
        )
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "invalid_body"
        assert "parse;dur=" in resp.headers["Server-Timing"]
        # Not JSON at all: parse too.
        resp = await client.post(CHAT, data=b"{", headers=JSON)
        assert resp.status == 400
        assert "parse;dur=" in resp.headers["Server-Timing"]
    assert [sorted(r.stages) for r in records] == [["parse", "total", "ttft"]] * 2
    observer.telemetry.log.close()
