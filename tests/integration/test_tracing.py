"""OpenTelemetry traces with the SDK's in-memory exporter: the router app in process over a
real socket, in front of a real sim region; a client's traceparent continued, the router's
own sent on to the region, GenAI attributes on the request and attempt spans."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from router.config import loads
from router.server.app import build_app
from tests.integration.conftest import MODEL, RouterFactory, SimFactory, regions_toml, sim_stats
from tests.support import free_port

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


async def test_spans_reach_a_real_otlp_http_receiver(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received.append(message)
        return web.Response(content_type="application/x-protobuf", body=b"")

    receiver = web.Application()
    receiver.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(receiver)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        header = (
            f'[observability]\notlp_endpoint = "http://127.0.0.1:{port}/v1/traces"\n'
            'service_name = "router-under-test"\n'
        )
        router = await asyncio.to_thread(router_proc, regions_toml(sim_region("a"), header=header))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        async with (
            aiohttp.ClientSession() as session,
            session.post(router.url + "/v1/chat/completions", json=body) as resp,
        ):
            assert resp.status == 200
        # SIGTERM: the app stops and the batch processor flushes to the receiver.
        router.popen.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(router.popen.wait, 30) == 0
    finally:
        await runner.cleanup()
    spans = [
        (resource.resource, span)
        for message in received
        for resource in message.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    names = sorted(span.name for _, span in spans)
    assert names == [f"chat {MODEL}", f"chat {MODEL}"]
    service = {
        a.key: a.value.string_value for a in spans[0][0].attributes if a.key == "service.name"
    }
    assert service == {"service.name": "router-under-test"}


async def test_span_names_never_carry_what_a_client_made_up(
    traced: tuple[str, InMemorySpanExporter, object, object],
) -> None:
    url, exporter, _, _ = traced
    hi = [{"role": "user", "content": "hi"}]
    asks = [
        ("/v1/nope-a1b2c3", {"model": MODEL}, 404),
        ("/v1/chat/completions", {"model": "made-up-9f8e", "messages": []}, 400),
        ("/v1/chat/completions", {"model": "made-up-9f8e", "messages": hi}, 404),
        ("/v1/chat/completions", {"model": "m" * 300_000, "messages": hi}, 400),
    ]
    answers = []
    async with aiohttp.ClientSession() as session:
        for path, body, status in asks:
            async with session.post(url + path, json=body) as resp:
                assert resp.status == status, path
                answers.append(await resp.read())
    names = [s.name for s in _by_kind(exporter.get_finished_spans(), SpanKind.SERVER)]
    assert names == ["router unknown"] + ["router /v1/chat/completions"] * 3
    # The model past the bound is refused in OpenAI's shape, without its 300 KB echoed.
    assert len(answers[-1]) < 1000
    error = json.loads(answers[-1])["error"]
    assert (error["param"], error["type"]) == ("model", "invalid_request_error")
    assert "256" in error["message"]


async def test_a_model_past_the_bound_is_refused_in_anthropics_shape_on_messages(
    traced: tuple[str, InMemorySpanExporter, object, object],
) -> None:
    url, _, _, _ = traced
    body = {"model": "m" * 257, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/messages", json=body) as resp,
    ):
        assert resp.status == 400
        answer = await resp.json()
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert "256" in answer["error"]["message"]
