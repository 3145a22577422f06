"""OpenTelemetry traces with the SDK's in-memory exporter: the router app in process over a
real socket, in front of a real sim region; a client's traceparent continued, the router's
own sent on to the region, GenAI attributes on the request and attempt spans."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from router.config import loads
from router.server.app import build_app
from tests.integration.conftest import MODEL, SimFactory, regions_toml, sim_stats

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
async def traced(
    sim_region: SimFactory,
) -> AsyncIterator[tuple[str, InMemorySpanExporter, object, object]]:
    dead = sim_region("dead", fail_mode="503")
    live = sim_region("live")
    text = "[health]\nenabled = false\n" + regions_toml(dead, live)
    exporter = InMemorySpanExporter()
    # `dead` first: nearest by config order when nothing is measured yet is not guaranteed,
    # so biasing `live` away makes the failover deterministic.
    text = text.replace('name = "live"', 'name = "live"\nbias_ms = 1000.0')
    app = build_app(loads(text, "traced.toml"), span_exporter=exporter)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")), exporter, dead, live
    await server.close()


def _by_kind(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in spans if s.kind == kind]


async def test_spans_per_request_and_attempt_with_genai_attributes(
    traced: tuple[str, InMemorySpanExporter, object, object],
) -> None:
    url, exporter, _dead, live = traced
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"traceparent": f"00-{TRACE}-{PARENT}-01"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        answer = await resp.json()
    spans = exporter.get_finished_spans()
    (request,) = _by_kind(spans, SpanKind.SERVER)
    attempts = _by_kind(spans, SpanKind.CLIENT)
    # The client's trace continues: same trace id, the client's span as parent.
    assert f"{request.context.trace_id:032x}" == TRACE
    assert request.parent is not None
    assert f"{request.parent.span_id:016x}" == PARENT
    assert request.name == f"chat {MODEL}"
    attrs = request.attributes or {}
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"]
    assert attrs["router.region"] == "live"
    assert attrs["router.failovers"] == 1
    # One span per attempt, under the request span: the 503 then the failover.
    assert [(a.attributes or {})["router.region"] for a in attempts] == ["dead", "live"]
    for attempt in attempts:
        assert attempt.parent is not None
        assert attempt.parent.span_id == request.context.span_id
        assert attempt.context.trace_id == request.context.trace_id
    first, second = (a.attributes or {} for a in attempts)
    assert first["error.type"] == "status"
    assert first["router.failover"] is False
    assert second["router.failover"] is True
    assert second["server.address"] == "127.0.0.1"
    assert second["server.port"] == live.port  # type: ignore[attr-defined]
    # The region saw the router's span as its parent, in the client's trace.
    sent = {k.lower(): v for k, v in sim_stats(live)["last_headers"].items()}  # type: ignore[arg-type]
    assert sent["traceparent"] == f"00-{TRACE}-{request.context.span_id:016x}-01"


async def test_a_request_without_traceparent_starts_a_trace(
    traced: tuple[str, InMemorySpanExporter, object, object],
) -> None:
    url, exporter, _, _ = traced
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200
    (request,) = _by_kind(exporter.get_finished_spans(), SpanKind.SERVER)
    assert request.parent is None
    assert request.context.trace_id != 0
