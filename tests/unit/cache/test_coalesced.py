"""Coalesced followers through the pipeline and the cache, regions in process (LocalTransport):
they get the answer their leader got, whatever it was, and an exchange nobody reads stops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from router.cache.serving import CacheLayer, cache_headers
from router.cache.tiers import ResponseCache
from router.config import AuthConfig, CacheConfig, Config, RoutingConfig
from router.core.request import CHAT, MESSAGES, RESPONSES
from router.core.transport import LocalReply, LocalTransport
from router.native import count_tokens
from tests.unit.core.test_event_streams import OPENING, ev, events_of
from tests.unit.core.test_pipeline import (
    JSON,
    SSE,
    Handler,
    Metered,
    app_for,
    delta,
    echoes,
    event,
    texts,
)

STREAMS: dict[str, dict[str, Any]] = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"model": "m", "input": "hi", "store": False},
    MESSAGES: {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
}

Cached = tuple[TestClient[Any, Any], ResponseCache, dict[str, LocalTransport]]


@asynccontextmanager
async def cached(
    regions: dict[str, Handler],
    routing: RoutingConfig | None = None,
    kind: str = "vllm",
    handler_cancellation: bool = False,
) -> AsyncIterator[Cached]:
    """A client of the pipeline with the response cache (coalescing on) in front of `regions`
    (servers of `kind`, `routing`'s policy; aiohttp cancelling a left client's handler or not)."""
    config = Config(regions=(), auth=AuthConfig(enabled=False), cache=CacheConfig(enabled=True))
    layer = CacheLayer(config)
    app, transports = app_for(regions, routing, kind=kind, cache=layer, decorators=(cache_headers,))
    app.cleanup_ctx.append(layer.lifetime)
    server = TestServer(app, host="127.0.0.1", handler_cancellation=handler_cancellation)
    async with TestClient(server) as client:
        assert layer.cache is not None
        yield client, layer.cache, transports


async def until(done: Callable[[], bool]) -> None:
    """Let the requests run until `done()` holds (bounded)."""
    for _ in range(2000):
        if done():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


async def joined(cache: ResponseCache, followers: int) -> None:
    """Until `followers` requests in all joined a flight."""
    await until(lambda: cache.flights.followed >= followers)


def ask(endpoint: str, stream: bool = True) -> dict[str, Any]:
    return {**STREAMS[endpoint], "temperature": 0, "stream": stream}


Answer = tuple[int, str | None, str | None, str | None, bytes, str | None]


async def answer(resp: ClientResponse) -> Answer:
    body = await resp.read()
    h = resp.headers
    status, kind, retry = resp.status, h.get("Content-Type"), h.get("Retry-After")
    return status, kind, retry, h.get("x-cache"), body, h.get("x-region-trace")


async def burst(client: TestClient[Any, Any], endpoint: str, body: object, n: int) -> list[Answer]:
    async def one() -> Answer:
        async with client.post(endpoint, json=body) as resp:
            return await answer(resp)

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    return await asyncio.gather(*tasks)


def held(reply: LocalReply, release: asyncio.Event) -> Handler:
    """A region that answers `reply` once `release` is set."""

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        await release.wait()
        return reply

    return handle


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES, MESSAGES])
async def test_stream_followers_of_a_region_4xx_get_that_answer(endpoint: str) -> None:
    release = asyncio.Event()
    refusal = b'{"error":{"message":"bad","type":"invalid_request_error"}}'
    region = held(LocalReply(400, {**JSON, "x-region-trace": "t-1"}, [refusal]), release)
    async with cached({"a": region}) as (client, cache, transports):
        answers = asyncio.create_task(burst(client, endpoint, ask(endpoint), 4))
        await joined(cache, 3)
        release.set()
        got = await answers
    assert len(transports["a"].requests) == 1
    assert sorted(a[3] or "" for a in got) == ["HIT", "HIT", "HIT", "MISS"]
    # Each its leader's answer as it was: a 400 JSON body, never an empty 200 stream, with the
    # region's headers.
    assert {(*a[:3], a[5]) for a in got} == {(400, "application/json", None, "t-1")}
    assert len({a[4] for a in got}) == 1
    assert b"bad" in got[0][4]


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("refusal", ["rate_limit", "context_length"])
async def test_followers_of_a_refused_request_get_the_same_refusal(
    refusal: str, stream: bool
) -> None:
    """Issue: followers got a router 502 without Retry-After, each going to the region again."""
    release = asyncio.Event()
    if refusal == "rate_limit":
        error = b'{"error":{"message":"slow down","type":"rate_limit_error"}}'
        reply = LocalReply(429, {**JSON, "Retry-After": "30"}, [error])
    else:
        error = b'{"error":{"message":"too long","code":"context_length_exceeded"}}'
        reply = LocalReply(400, JSON, [error])
    async with cached({"a": held(reply, release)}) as (client, cache, transports):
        # One request alone: what the region sees for it, and what its client gets.
        release.set()
        alone = (await burst(client, CHAT, ask(CHAT, stream), 1))[0]
        asked = len(transports["a"].requests)
        release.clear()
        answers = asyncio.create_task(burst(client, CHAT, ask(CHAT, stream), 4))
        await joined(cache, 3)
        release.set()
        got = await answers
    assert len(transports["a"].requests) == 2 * asked
    assert sorted(a[3] or "" for a in got) == ["HIT", "HIT", "HIT", "MISS"]
    assert {(a[0], a[2], a[4]) for a in got} == {(alone[0], alone[2], alone[4])}
    assert alone[0] == reply.status
    assert alone[2] == ("30" if refusal == "rate_limit" else None)


async def test_a_responses_followers_failure_event_carries_the_streams_id_and_number() -> None:
    release = asyncio.Event()

    async def breaks(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            for opening in OPENING:
                yield opening
            yield ev("response.output_text.delta", delta="Hi", sequence_number=2)
            await release.wait()
            raise ConnectionResetError("region died")

        return LocalReply(200, SSE, chunks())

    async with cached({"a": breaks}) as (client, _, _):
        leader = await client.post(RESPONSES, json=ask(RESPONSES))
        first = await leader.content.readany()
        follower = await client.post(RESPONSES, json=ask(RESPONSES))
        assert follower.headers["x-cache"] == "HIT"
        followed = await follower.content.readany()  # it relayed the events so far
        release.set()
        raw_leader = first + await leader.read()
        raw_follower = followed + await follower.read()
    led, followed_events = events_of(raw_leader), events_of(raw_follower)
    assert [e["type"] for e in followed_events] == [e["type"] for e in led]
    failed = followed_events[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["id"] == "resp_1"
    assert failed["sequence_number"] == 3
    assert failed == led[-1] | {"response": failed["response"]}


async def test_an_exchange_nobody_reads_any_more_stops() -> None:
    """The leader's client and its only follower hang up: the region's stream is closed."""
    stopped = asyncio.Event()

    async def endless(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                for i in range(100_000):
                    yield delta(f"{i} ")
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                stopped.set()
                raise

        return LocalReply(200, SSE, chunks())

    async with cached({"a": endless}) as (client, cache, _):
        leader = await client.post(CHAT, json=ask(CHAT))
        await leader.content.readany()
        follower = await client.post(CHAT, json=ask(CHAT))
        await follower.content.readany()
        leader.close()
        # The exchange goes on for the follower...
        await until(lambda: any(f.detached for f in cache.flights._flights.values()))
        assert await follower.content.readany()
        assert not stopped.is_set()
        # ... until it leaves too.
        follower.close()
        await asyncio.wait_for(stopped.wait(), 10)
        assert len(cache.memory) == 0
        assert len(cache.flights) == 0


async def test_a_stream_hit_is_metered_as_the_stream_it_replays() -> None:
    metered = Metered()
    end = {"index": 0, "delta": {}, "finish_reason": "stop"}
    stream = [delta("Hello"), delta(" world"), event({"id": "x", "choices": [end]})]

    async def region(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return LocalReply(200, SSE, [*stream, b"data: [DONE]\n\n"])

    config = Config(regions=(), auth=AuthConfig(enabled=False), cache=CacheConfig(enabled=True))
    layer = CacheLayer(config)
    app, _ = app_for({"a": region}, cache=layer, decorators=(cache_headers,), filters=(metered,))
    app.cleanup_ctx.append(layer.lifetime)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for outcome in ("MISS", "HIT"):
            async with client.post(CHAT, json=ask(CHAT)) as resp:
                await resp.read()
                assert resp.headers["x-cache"] == outcome
    miss, hit = metered.meters
    assert hit.used() == miss.used() == count_tokens("Hello world", "cl100k_base")


def breaks_once(release: asyncio.Event) -> Handler:
    """A region that streams "Hel", waits for `release`, streams "lo", then dies."""

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            yield delta("Hel")
            await release.wait()
            yield delta("lo")
            raise ConnectionResetError("region died")

        return LocalReply(200, SSE, chunks())

    return handle


async def test_followers_of_a_continued_stream_get_it_whole_and_it_is_never_stored() -> None:
    """Issue: a leader's stream continued on another region reached its own client whole, while
    its followers got the first region's part, then an error, and were counted as hits."""
    release = asyncio.Event()

    regions = {"a": breaks_once(release), "b": echoes("Hello", " world")}
    resume = RoutingConfig(midstream="resume")
    async with cached(regions, resume, kind="llama-server") as (client, cache, transports):
        answers = asyncio.create_task(burst(client, CHAT, ask(CHAT), 3))
        await joined(cache, 2)
        release.set()
        got = await answers
        assert sorted(a[3] or "" for a in got) == ["HIT", "HIT", "MISS"]
        assert [(a[0], texts(a[4])) for a in got] == [(200, ("Hello world", []))] * 3
        assert all(a[4].endswith(b"data: [DONE]\n\n") for a in got)
        # Two regions' answer: shared with the requests that waited for it, never stored.
        again = (await burst(client, CHAT, ask(CHAT), 1))[0]
        assert (again[3], texts(again[4])) == ("MISS", ("Hello world", []))
    assert len(transports["a"].requests) == len(transports["b"].requests) == 2


@pytest.mark.parametrize("cancels", [False, True], ids=["write-fails", "handler-cancelled"])
async def test_a_continuation_goes_on_for_its_followers_after_its_client_left(
    cancels: bool,
) -> None:
    """Issue: a leader's client leaving during a continuation cut it for its followers too:
    they got the first region's part and an error."""
    release, go_on = asyncio.Event(), asyncio.Event()

    async def continues(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            yield delta("Hello")  # llama-server answers the prefill back first
            await go_on.wait()
            yield delta(" world")
            end = {"index": 0, "delta": {}, "finish_reason": "stop"}
            yield event({"id": "x", "choices": [end]})
            yield b"data: [DONE]\n\n"

        return LocalReply(200, SSE, chunks())

    regions = {"a": breaks_once(release), "b": continues}
    resume = RoutingConfig(midstream="resume")
    async with cached(regions, resume, "llama-server", cancels) as (client, cache, transports):
        leader = await client.post(CHAT, json=ask(CHAT))
        await leader.content.readany()
        followers = asyncio.create_task(burst(client, CHAT, ask(CHAT), 2))
        await joined(cache, 2)
        release.set()
        await until(lambda: len(transports["b"].requests) == 1)  # the continuation started
        leader.close()  # the leader's client leaves in the middle of it
        await asyncio.sleep(0.2)
        go_on.set()
        got = await followers
    assert [(a[0], a[3], texts(a[4])) for a in got] == [(200, "HIT", ("Hello world", []))] * 2
