"""The driver and its one attempt path, in process: regions behind core.transport.LocalTransport.

Failover, hedging and mid-stream continuation, without a region subprocess: the client side is
aiohttp's test server on 127.0.0.1, the regions answer in process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import ClientPayloadError, web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from router.access.usage import StreamUsage
from router.config import Config, RegionConfig, RoutingConfig, ServerConfig
from router.core import relay
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind
from router.core.pipeline import Features, Pipeline
from router.core.request import CHAT, COMPLETIONS, MESSAGES, RESPONSES
from router.core.stages import (
    AttemptObserver,
    Origin,
    RequestFilter,
    ResponseCache,
    ResponseDecorator,
)
from router.core.transport import LocalReply, LocalTransport
from router.core.upstream import Upstream, Upstreams
from router.errors import Unavailable
from router.native import count_tokens
from router.routing.admission import Admission
from router.routing.continuation import MidstreamPolicy
from router.routing.hedge import hedger
from router.routing.runtime import LiveRouting, RetryState, routing_headers
from router.server.pools import RegionPools
from router.server.reload import LiveConfig

Handler = Callable[[str, bytes, CIMultiDict[str]], Awaitable[LocalReply]]
SSE = {"Content-Type": "text/event-stream"}
JSON = {"Content-Type": "application/json"}


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def delta(text: str) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return event({"id": "chatcmpl-a", "created": 1, "model": "m", "choices": [choice]})


def app_for(
    regions: dict[str, Handler],
    routing: RoutingConfig | None = None,
    kind: str = "vllm",
    cache: ResponseCache | None = None,
    decorators: tuple[ResponseDecorator, ...] = (),
    key: str | None = None,
    slots: Admission | None = None,
    filters: tuple[RequestFilter, ...] = (),
    observers: tuple[AttemptObserver, ...] = (),
    server: ServerConfig | None = None,
) -> tuple[web.Application, dict[str, LocalTransport]]:
    """The pipeline with routing's retry state, hedger, continuation and headers (and `cache`,
    and more `decorators`) in front of in-process regions (servers of `kind`, each with API
    `key`), tried in the order given."""
    configs = [
        msgspec.convert(
            {"name": n, "base_url": f"http://{n}:1/v1", "models": ["m"], "kind": kind},
            RegionConfig,
        )
        for n in regions
    ]
    transports = {n: LocalTransport(h) for n, h in regions.items()}
    config = Config(
        regions=tuple(configs), routing=routing or RoutingConfig(), server=server or ServerConfig()
    )
    live = LiveRouting(config.routing)
    pools = RegionPools(Upstreams(Upstream(c, transports[c.name], key) for c in configs))
    features = Features(
        retry=RetryState(live),
        hedger=hedger(lambda: live.config.hedge_endpoints, lambda region: 0.05),
        continuer=MidstreamPolicy(
            live.config.midstream,
            max_resumes=live.config.max_resumes,
            report=lambda ctx, region: None,
        ),
        decorators=(routing_headers, *decorators),
        cache=cache,
        slots=slots,
        filters=filters,
        observers=observers,
    )
    pipeline = Pipeline(features, LiveConfig(config), pools)
    app = web.Application()
    app.on_response_prepare.append(pipeline.on_prepare)
    for endpoint in (CHAT, COMPLETIONS, RESPONSES, MESSAGES):
        app.router.add_post(endpoint, pipeline.handler(endpoint))
    return app, transports


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_failover_goes_to_the_next_region_and_says_so() -> None:
    async def down(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(503, JSON, [b'{"error":{"message":"busy"}}'])

    async def up(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        assert path == "/v1/chat/completions"
        return LocalReply(200, JSON, [b'{"choices":[]}'])

    app, transports = app_for({"a": down, "b": up})
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        assert resp.status == 200
        assert await resp.read() == b'{"choices":[]}'
        assert resp.headers["x-router-region"] == "b"
        assert (resp.headers["x-router-attempts"], resp.headers["x-router-failovers"]) == ("2", "1")
    assert len(transports["a"].requests) == len(transports["b"].requests) == 1
    # The region gets the client's body as sent, and a request id, never the client's key.
    sent = transports["b"].requests[0][2]
    assert "X-Request-Id" in sent


async def test_every_region_failing_relays_the_last_answer() -> None:
    async def down(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(503, JSON, [b'{"error":{"message":"busy"}}'])

    app, _ = app_for({"a": down, "b": down})
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        assert resp.status == 503
        assert await resp.json() == {"error": {"message": "busy"}}


async def test_a_hedge_wins_when_the_first_region_is_slow() -> None:
    async def slow(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        await asyncio.sleep(5)
        return LocalReply(200, JSON, [b"{}"])

    async def fast(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(200, JSON, [b'{"fast":true}'])

    app, transports = app_for({"a": slow, "b": fast}, RoutingConfig(hedge_endpoints=(CHAT,)))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        assert await resp.json() == {"fast": True}
        assert resp.headers["x-router-hedged"] == "b"
        assert resp.headers["x-router-region"] == "b"
        # A hedge is an attempt beside the first, not a failover after it.
        assert resp.headers["x-router-failovers"] == "0"
    assert len(transports["a"].requests) == 1


async def test_a_broken_stream_is_continued_on_the_next_region() -> None:
    async def breaks(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            yield delta("Hel")
            yield delta("lo")
            raise ConnectionResetError("region died")

        return LocalReply(200, SSE, chunks())

    async def continues(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        sent = json.loads(raw)
        assert sent["messages"][-1] == {"role": "assistant", "content": "Hello"}
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        end = {"index": 0, "delta": {}, "finish_reason": "stop"}
        return LocalReply(
            200,
            SSE,
            [
                event({"id": "chatcmpl-b", "choices": [role]}),
                event({"id": "chatcmpl-b", "choices": [end]}),
                b"data: [DONE]\n\n",
            ],
        )

    app, transports = app_for({"a": breaks, "b": continues}, RoutingConfig(midstream="resume"))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True))
        raw = await resp.read()
    payloads = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    # One stream under the first stream's id; the continuation's role preamble is dropped.
    assert {c["id"] for c in chunks} == {"chatcmpl-a"}
    assert [c["choices"][0].get("finish_reason") for c in chunks] == [None, None, "stop"]
    assert len(transports["b"].requests) == 1


async def test_a_continuation_stops_at_what_is_left_of_max_response_bytes() -> None:
    # A continuation read on past server.max_response_bytes (a region's 80 MB went through).
    async def floods(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        end = {"index": 0, "delta": {}, "finish_reason": "stop"}
        pieces = [delta("x" * 100) for _ in range(200)]
        return LocalReply(200, SSE, [*pieces, event({"id": "b", "choices": [end]})])

    app, _ = app_for(
        {"a": breaks_after("Hel", "lo"), "b": floods},
        RoutingConfig(midstream="resume"),
        server=ServerConfig(max_response_bytes=8192),
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True))
        raw = await resp.read()
    text, errors = texts(raw)
    assert text.startswith("Hello")
    assert len(raw) < 2 * 8192
    assert errors == ["upstream_stream_error"]


def breaks_after(*pieces: str) -> Handler:
    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield delta(piece)
            raise ConnectionResetError("region died")

        return LocalReply(200, SSE, chunks())

    return handle


def regenerates(*pieces: str) -> Handler:
    """A region without prefill continuation: it answers the original request from scratch."""

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        sent = json.loads(raw)
        assert sent["messages"][-1]["role"] == "user"  # the request as the client sent it
        end = {"index": 0, "delta": {}, "finish_reason": "stop"}
        events = [delta(p) for p in pieces] + [event({"id": "x", "choices": [end]})]
        return LocalReply(200, SSE, [*events, b"data: [DONE]\n\n"])

    return handle


def texts(raw: bytes) -> tuple[str, list[str]]:
    """(streamed text, error codes) of an SSE body."""
    text, errors = "", []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            if "error" in obj:
                errors.append(obj["error"]["code"])
            for choice in obj.get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
    return text, errors


async def test_a_region_that_cannot_continue_regenerates_a_deterministic_request() -> None:
    app, _ = app_for(
        {"a": breaks_after("Hel", "lo"), "b": regenerates("He", "llo w", "orld")},
        RoutingConfig(midstream="resume"),
        kind="llama-cpp-python",
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True, temperature=0))
        raw = await resp.read()
    assert texts(raw) == ("Hello world", [])
    assert raw.endswith(b"data: [DONE]\n\n")


async def test_a_regenerated_answer_that_differs_ends_with_one_error_event() -> None:
    app, _ = app_for(
        {"a": breaks_after("Hel", "lo"), "b": regenerates("Help", " me")},
        RoutingConfig(midstream="resume"),
        kind="llama-cpp-python",
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True, temperature=0))
        raw = await resp.read()
    assert texts(raw) == ("Hello", ["upstream_stream_error"])


async def test_a_sampled_request_is_never_regenerated() -> None:
    app, regions = app_for(
        {"a": breaks_after("Hel", "lo"), "b": regenerates("Hello", " world")},
        RoutingConfig(midstream="resume"),
        kind="llama-cpp-python",
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True, temperature=0.7))
        raw = await resp.read()
    assert texts(raw) == ("Hello", ["upstream_stream_error"])
    assert regions["b"].requests == []


def echoes(prefill: str, *pieces: str) -> Handler:
    """llama-server: continues a trailing assistant message, and sends the prefill back first."""

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        assert json.loads(raw)["messages"][-1] == {"role": "assistant", "content": prefill}
        end = {"index": 0, "delta": {}, "finish_reason": "stop"}
        events = [delta(prefill)] + [delta(p) for p in pieces]
        return LocalReply(
            200, SSE, [*events, event({"id": "x", "choices": [end]}), b"data: [DONE]\n\n"]
        )

    return handle


async def test_a_continuation_that_echoes_the_prefill_is_not_duplicated() -> None:
    app, _ = app_for(
        {"a": breaks_after("Hel", "lo"), "b": echoes("Hello", " world")},
        RoutingConfig(midstream="resume"),
        kind="llama-server",
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True))
        raw = await resp.read()
    assert texts(raw) == ("Hello world", [])


class FailsMidAnswer:
    """A cache stage that starts its own answer (as a hit's replay does), then raises `error`."""

    def __init__(self, error: Exception, content_type: str = "text/event-stream") -> None:
        self.error = error
        self.content_type = content_type

    async def serve(
        self, request: web.Request, ctx: RequestContext, origin: Origin
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": self.content_type})
        await resp.prepare(request)
        await resp.write(delta("Hel") if self.content_type == "text/event-stream" else b'{"ch')
        raise self.error


def never(path: str, raw: bytes, headers: CIMultiDict[str]) -> Awaitable[LocalReply]:
    raise AssertionError("the cache stage answers; no region is asked")


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        (RuntimeError("a bug"), "The router failed mid-stream."),
        (Unavailable("No region can serve model `m` now."), "No region can serve model `m` now."),
    ],
)
async def test_a_failure_after_an_answer_began_ends_that_answer_and_makes_no_second_one(
    error: Exception, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = app_for({"a": never}, cache=FailsMidAnswer(error))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for _ in range(2):  # the connection is still good for the next request
            resp = await client.post(CHAT, json=body(stream=True))
            raw = await resp.read()
            assert resp.status == 200
            assert b"HTTP/1.1" not in raw
            payloads = [
                json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")
            ]
            assert payloads[0]["choices"][0]["delta"] == {"content": "Hel"}
            assert [p["error"]["message"] for p in payloads[1:]] == [logged]
    assert "failed after its response began" in caplog.text


async def test_a_failure_after_an_answer_began_ends_in_the_apis_own_shape() -> None:
    app, _ = app_for({"a": never}, cache=FailsMidAnswer(RuntimeError("a bug")))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(
            MESSAGES,
            json={"model": "m", "max_tokens": 5, "stream": True, **body()},
        )
        raw = await resp.read()
    assert raw.endswith(b"event: error\ndata: " + raw.rpartition(b"data: ")[2])
    assert json.loads(raw.rpartition(b"data: ")[2])["type"] == "error"
    assert b"HTTP/1.1" not in raw


async def test_a_whole_answer_that_fails_after_its_head_is_cut_not_answered_twice() -> None:
    cache = FailsMidAnswer(RuntimeError("a bug"), content_type="application/json")
    app, _ = app_for({"a": never}, cache=cache)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        assert resp.status == 200
        with pytest.raises(ClientPayloadError):
            await resp.read()


async def test_a_client_gone_after_an_answer_began_is_let_go_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, _ = app_for({"a": never}, cache=FailsMidAnswer(ConnectionResetError("client left")))
    caplog.set_level(logging.WARNING, "router")
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True))
        raw = await resp.read()
    assert raw.count(b"data: ") == 1  # the event it had; nobody is told of a client's leaving
    assert "router" not in {r.name for r in caplog.records}


class RecordingTap:
    """A cache's tee that others read (coalesced requests): records what it is given."""

    def refused(self, answer: web.Response) -> None:
        raise AssertionError("answered")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.ended = asyncio.Event()
        self.clean: bool | None = None

    def chunk(self, data: bytes) -> None:
        self.chunks.append(data)

    def end(self, clean: bool) -> None:
        self.clean = clean
        self.ended.set()

    def body(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        raise AssertionError("a stream")

    def wanted(self) -> bool:
        return True

    def detach(self) -> None:
        pass


class Tees:
    """A cache stage that always misses and tees the origin's answer into `tap`."""

    def __init__(self, tap: RecordingTap) -> None:
        self.tap = tap

    async def serve(
        self, request: web.Request, ctx: RequestContext, origin: Origin
    ) -> web.StreamResponse:
        return await origin(self.tap)


async def test_a_client_leaving_during_a_write_takes_nothing_from_the_others_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pieces = [delta(t) for t in ("a", "b", "c", "d")] + [
        event(
            {"id": "chatcmpl-a", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        ),
        b"data: [DONE]\n\n",
    ]

    async def region(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece
                await asyncio.sleep(0.01)  # one write to the client each

        return LocalReply(200, SSE, chunks())

    writes = 0

    class LeavesDuringSecondWrite(relay.StreamResponse):
        async def write(self, data: bytes) -> None:
            nonlocal writes
            writes += 1
            if writes == 2:  # the client is gone in the middle of this write
                assert self._req is not None
                assert self._req.transport is not None
                self._req.transport.close()
                raise ConnectionResetError("client left")
            await super().write(data)

    monkeypatch.setattr(relay, "StreamResponse", LeavesDuringSecondWrite)
    tap = RecordingTap()
    app, _ = app_for({"a": region}, cache=Tees(tap))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        with contextlib.suppress(aiohttp.ClientError):
            resp = await client.post(CHAT, json=body(stream=True))
            await resp.read()
        await asyncio.wait_for(tap.ended.wait(), 10)
    assert writes >= 2
    assert tap.clean is True
    assert b"".join(tap.chunks) == b"".join(pieces)


KEY = "sk-region-SECRET/0123456789"
# The key as a region may echo it: as written, JSON-escaped (`\/`, `\u002d`, upper-case hex).
ECHOES = [
    KEY,
    KEY.replace("/", "\\/"),
    KEY.replace("-", "\\u002d"),
    "\\u0073" + KEY[1:].replace("-", "\\u002D"),
]


def echoing(status: int, stream: bool = False) -> Handler:
    """A region that echoes the router's key in its headers and in every form in its body."""

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        assert headers["Authorization"] == f"Bearer {KEY}"
        text = " ".join(ECHOES)
        echoed = {"X-Echo-Auth": headers["Authorization"], "X-Fine": "kept"}
        if stream:
            end = {"index": 0, "delta": {}, "finish_reason": "stop"}
            # Written as bytes: json.dumps would escape the escapes (no longer the key).
            echo = b'data: {"id":"chatcmpl-a","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'
            events = [
                echo % text.encode(),
                event({"id": "chatcmpl-a", "choices": [end]}),
                b"data: [DONE]\n\n",
            ]
            return LocalReply(status, {**SSE, **echoed}, events)
        answer = b'{"choices":[{"index":0,"message":{"content":"' + text.encode() + b'"}}]}'
        if status >= 400:
            # An error answer is relayed only as an API error (else the router's own).
            answer = b'{"error":{"message":"' + text.encode() + b'"}}'
        return LocalReply(status, {**JSON, **echoed}, [answer])

    return handle


@pytest.mark.parametrize(
    ("status", "stream"), [(200, False), (200, True), (400, False), (503, False)]
)
async def test_the_regions_key_never_reaches_the_client(status: int, stream: bool) -> None:
    app, _ = app_for({"a": echoing(status, stream)}, key=KEY)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=stream))
        raw = await resp.read()
    assert resp.status == status
    assert "X-Echo-Auth" not in resp.headers
    assert resp.headers["X-Fine"] == "kept"
    for form in ECHOES:
        assert form.encode() not in raw, form
    assert b"SECRET" not in raw
    assert raw.count(b"***") >= len(ECHOES)


@pytest.mark.parametrize("status", [401, 403, 407])
async def test_a_region_refusing_the_routers_key_is_a_failed_attempt_never_relayed(
    status: int,
) -> None:
    async def refuses(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        detail = b'{"error":{"message":"Incorrect API key provided: sk-regio****6789"}}'
        return LocalReply(status, {**JSON, "openai-organization": "org-secret"}, [detail])

    async def fine(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(200, JSON, [b'{"choices":[]}'])

    app, _ = app_for({"a": refuses, "b": fine}, key=KEY)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        assert (resp.status, resp.headers["x-router-region"]) == (200, "b")
    app, _ = app_for({"a": refuses}, key=KEY)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        raw = await resp.read()
    assert resp.status == 502
    assert json.loads(raw)["error"]["code"] == "upstream_error"
    assert b"sk-regio" not in raw
    assert "openai-organization" not in resp.headers


async def test_a_continuation_echoing_its_regions_key_is_blanked_too() -> None:
    app, _ = app_for(
        {"a": breaks_after("Hel", "lo"), "b": echoes("Hello", f" {KEY}")},
        RoutingConfig(midstream="resume"),
        kind="llama-server",
        key=KEY,
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True))
        raw = await resp.read()
    assert texts(raw) == ("Hello ***", [])
    assert KEY.encode() not in raw


def answers(text: str = "{}") -> Handler:
    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(200, JSON, [text.encode()])

    return handle


async def test_a_full_region_is_spilled_past_without_using_up_max_attempts() -> None:
    slots = Admission(max_in_flight=1, queue_size=0, max_wait_s=0.5)
    held = [await slots.acquire("a"), await slots.acquire("b")]
    regions = {"a": answers(), "b": answers(), "c": answers('{"from":"c"}')}
    app, _ = app_for(regions, RoutingConfig(max_attempts=2), slots=slots)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        assert (resp.status, await resp.json()) == (200, {"from": "c"})
        # The header counts the spills too (README), though max_attempts does not.
        assert resp.headers["x-router-attempts"] == "3"
        held.append(await slots.acquire("c"))
        # Every region full: 503 overloaded with a Retry-After, in the API's shape.
        full = await client.post(CHAT, json=body())
        assert full.status == 503
        assert int(full.headers["Retry-After"]) >= 1
        error = (await full.json())["error"]
        assert (error["type"], error["code"]) == ("server_error", "overloaded")
    for slot in held:
        slot.release()


async def test_a_hedge_at_a_full_region_leaves_the_first_attempt_to_answer() -> None:
    async def slow(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        await asyncio.sleep(0.3)
        return LocalReply(200, JSON, [b'{"from":"a"}'])

    slots = Admission(max_in_flight=1, queue_size=0, max_wait_s=0.5)
    held = await slots.acquire("b")
    routing = RoutingConfig(hedge_endpoints=(CHAT,))
    app, _ = app_for({"a": slow, "b": answers()}, routing, slots=slots)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        assert (resp.status, await resp.json()) == (200, {"from": "a"})
    held.release()


async def test_a_region_a_hedge_already_tried_is_not_tried_again() -> None:
    async def hangs(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        await asyncio.sleep(5)
        return LocalReply(200, JSON, [b"{}"])

    async def busy(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(503, JSON, [b'{"error":{"message":"busy"}}'])

    seen: list[tuple[str, str | None]] = []

    def observe(
        ctx: RequestContext, upstream: Upstream, error: AttemptError | None, seconds: float
    ) -> None:
        seen.append((upstream.name, error.kind if error is not None else None))

    routing = RoutingConfig(hedge_endpoints=(CHAT,), ttft_timeout_s=0.3)
    app, transports = app_for({"a": hangs, "b": busy}, routing, observers=(observe,))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        # What asking a, then b would have answered: b's own answer, not a's silence.
        assert resp.status == 503
        assert await resp.json() == {"error": {"message": "busy"}}
        assert resp.headers["x-router-hedged"] == "b"
        assert resp.headers["x-router-region"] == "b"
    assert len(transports["b"].requests) == 1
    # Each failure is held against its own region, once.
    assert sorted(seen) == [("a", FailureKind.TIMEOUT), ("b", FailureKind.STATUS)]


async def test_a_hedge_failing_at_both_ends_on_a_refusal_the_request_caused() -> None:
    async def hangs(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        await asyncio.sleep(5)
        return LocalReply(200, JSON, [b"{}"])

    too_long = b'{"error":{"message":"too long","code":"context_length_exceeded"}}'

    async def refuses(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(400, JSON, [too_long])

    routing = RoutingConfig(hedge_endpoints=(CHAT,), ttft_timeout_s=0.3)
    regions = {"a": hangs, "b": refuses, "c": answers()}
    app, transports = app_for(regions, routing)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        # Every region would refuse it: the refusal is the answer, c is not asked.
        assert (resp.status, await resp.read()) == (400, too_long)
    assert transports["c"].requests == []


async def test_a_continued_stream_gives_back_the_broken_regions_slot() -> None:
    slots = Admission(max_in_flight=1, queue_size=0, max_wait_s=0.5)
    seen: list[tuple[int, int]] = []

    async def continues(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        # Asked while the client's stream goes on: the region that broke holds nothing now.
        seen.append((slots.in_flight("a"), slots.in_flight("b")))
        return await echoes("Hello", " world")(path, raw, headers)

    routing = RoutingConfig(midstream="resume")
    regions = {"a": breaks_after("Hel", "lo"), "b": continues}
    app, _ = app_for(regions, routing, kind="llama-server", slots=slots)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True))
        assert texts(await resp.read()) == ("Hello world", [])
    assert seen == [(0, 1)]
    assert (slots.in_flight("a"), slots.in_flight("b")) == (0, 0)


class Metered:
    """A request filter giving each stream a token meter, as a token-limited key's grant has."""

    def __init__(self) -> None:
        self.meters: list[StreamUsage] = []

    async def admit(self, ctx: RequestContext, headers: Mapping[str, str]) -> None:
        if ctx.request.stream:
            ctx.meter = meter = StreamUsage(0, "cl100k_base")
            self.meters.append(meter)


async def test_a_continuation_is_metered_like_the_stream_it_continues() -> None:
    metered = Metered()
    app, _ = app_for(
        {"a": breaks_after("Hel", "lo"), "b": echoes("Hello", " world")},
        RoutingConfig(midstream="resume"),
        kind="llama-server",
        filters=(metered,),
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True))
        assert texts(await resp.read()) == ("Hello world", [])
    (meter,) = metered.meters
    assert meter.used() == count_tokens("Hello world", "cl100k_base")


class Seen:
    """A request filter keeping each request's context, to read what it settled on."""

    def __init__(self) -> None:
        self.contexts: list[RequestContext] = []

    async def admit(self, ctx: RequestContext, headers: Mapping[str, str]) -> None:
        self.contexts.append(ctx)


async def test_a_continuations_usage_is_the_requests_and_never_more_cached_than_prompt() -> None:
    async def continues(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        reply = await echoes("Hello", " world")(path, raw, headers)
        assert isinstance(reply.chunks, list)
        # Its content events say `"usage": null` (vLLM does, asked for usage): none reported.
        chunks = [c.replace(b'"choices"', b'"usage": null, "choices"') for c in reply.chunks]
        # The region's prompt held the prefill, and its cache covered most of it.
        usage = {
            "prompt_tokens": 30,
            "completion_tokens": 3,
            "total_tokens": 33,
            "prompt_tokens_details": {"cached_tokens": 29},
        }
        return LocalReply(200, SSE, [*chunks[:-1], event({"choices": [], "usage": usage})])

    seen = Seen()
    app, _ = app_for(
        {"a": breaks_after("Hel", "lo"), "b": continues},
        RoutingConfig(midstream="resume"),
        kind="llama-server",
        filters=(seen,),
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        ask = body(stream=True, stream_options={"include_usage": True})
        resp = await client.post(CHAT, json=ask)
        raw = await resp.read()
    assert texts(raw) == ("Hello world", [])
    events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    usage = next(e["usage"] for e in events if e.get("usage"))
    # The two events the client had moved from the prompt to the completion.
    assert usage == {
        "prompt_tokens": 28,
        "completion_tokens": 5,
        "total_tokens": 33,
        "prompt_tokens_details": {"cached_tokens": 28},
    }
    # What the request reports (metrics, access log, traces) is that usage.
    (ctx,) = seen.contexts
    assert [json.loads(p)["usage"] for p in ctx.reported] == [usage]


def completion_chunks(*pieces: str, cut: bool = False) -> Handler:
    """A completions stream of `pieces`; `cut`: the connection breaks after them."""

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        assert path == COMPLETIONS

        async def chunks() -> AsyncIterator[bytes]:
            for piece in pieces:
                choice = {"index": 0, "text": piece, "finish_reason": None}
                yield event({"id": "cmpl-x", "object": "text_completion", "choices": [choice]})
            if cut:
                raise ConnectionResetError("region died")
            end = {"index": 0, "text": "", "finish_reason": "stop"}
            yield event({"id": "cmpl-y", "choices": [end]})
            yield b"data: [DONE]\n\n"

        return LocalReply(200, SSE, chunks())

    return handle


def completion_text(raw: bytes) -> tuple[str, set[str], int]:
    """(text, ids, error events) of a completions SSE body."""
    text, ids, errors = "", set(), 0
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            if "error" in obj:
                errors += 1
                continue
            ids.add(obj["id"])
            text += "".join(c.get("text") or "" for c in obj["choices"])
    return text, ids, errors


@pytest.mark.parametrize("kind", ["llama-server", "llama-cpp-python"])
async def test_a_broken_completions_stream_is_carried_on(kind: str) -> None:
    prompt = "Once upon"
    sent: list[bytes] = []
    cut = completion_chunks(" a", " time", cut=True)
    whole = completion_chunks(" a", " time", " there", " was")  # regenerated from the start
    rest = completion_chunks(" there", " was")  # carried on from the prompt and " a time"

    async def survivor(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        sent.append(raw)
        return await (rest if kind == "llama-server" else whole)(path, raw, headers)

    app, _ = app_for({"a": cut, "b": survivor}, RoutingConfig(midstream="resume"), kind=kind)
    ask = {"model": "m", "prompt": prompt, "max_tokens": 10, "temperature": 0, "stream": True}
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(COMPLETIONS, json=ask)
        raw = await resp.read()
    assert completion_text(raw) == (" a time there was", {"cmpl-x"}, 0)
    assert raw.endswith(b"data: [DONE]\n\n")
    (again,) = sent
    if kind == "llama-server":
        assert json.loads(again)["prompt"] == "Once upon a time"
        assert json.loads(again)["max_tokens"] == 8
    else:
        assert json.loads(again) == ask


async def test_a_chat_stream_of_several_choices_is_not_carried_on() -> None:
    """Its text so far is several answers': no one prefill continues them."""

    async def unused(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        raise AssertionError("asked to continue several choices as one")

    app, transports = app_for(
        {"a": breaks_after("Red", " apple"), "b": unused},
        RoutingConfig(midstream="resume"),
        kind="llama-server",
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=True, n=2))
        raw = await resp.read()
    assert texts(raw) == ("Red apple", ["upstream_stream_error"])
    assert transports["b"].requests == []


@pytest.mark.parametrize(("kind", "status"), [("llama-server", 400), ("vllm", 500)])
async def test_only_a_server_that_may_be_llama_cpps_refuses_with_a_500(
    kind: str, status: int
) -> None:
    refusal = (
        b'{"error":{"code":500,"message":"image input is not supported","type":"server_error"}}'
    )

    async def refuses(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(500, JSON, [refusal])

    app, _ = app_for({"a": refuses}, kind=kind)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body())
        # llama-server's request error: a 400; vLLM's 500 is its own server error, relayed.
        assert resp.status == status


@pytest.mark.parametrize(("status", "stream"), [(200, False), (200, True), (400, False)])
async def test_every_answer_says_no_store_whatever_the_region_said(
    status: int, stream: bool
) -> None:
    """Issue: a region's Cache-Control, Expires, ETag, Vary (...) were relayed, so a shared
    cache in front of the router could keep one tenant's answer for another."""
    cacheable = {"Cache-Control": "public, max-age=86400", "ETag": '"x"', "Vary": "Origin"}

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        if stream:
            end = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            return LocalReply(200, {**SSE, **cacheable}, [event(end), b"data: [DONE]\n\n"])
        answer = b'{"error": {"message": "no"}}' if status >= 400 else b'{"choices": []}'
        return LocalReply(status, {**JSON, **cacheable}, [answer])

    app, _ = app_for({"a": handle})
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(stream=stream))
        await resp.read()
    assert resp.status == status
    assert resp.headers.getall("Cache-Control") == ["no-store"]
    assert "ETag" not in resp.headers
    assert "Vary" not in resp.headers
