"""A cached stream replays the bytes the live relay sent, not only its `data:` payloads: the
`event:`, `id:` and `retry:` fields and the comments a region sent (some OpenAI-compatible
servers send them on chat and completions streams too), `data:` with or without its space,
its line endings, reach a hit and a coalesced follower as they reached the first client, in
every API (regions in process)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import pytest
from multidict import CIMultiDict

from router.cache.policy import StreamRecorder
from router.cache.redis_tier import VERSION, decode_entry, encode_entry, plausible, redis_key
from router.core.request import CHAT, COMPLETIONS, MESSAGES, RESPONSES
from router.core.transport import LocalReply
from router.net import sse
from tests.unit.cache.test_coalesced import Answer, burst, cached, joined
from tests.unit.core.test_pipeline import SSE, Handler

BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"model": "m", "prompt": "hi"},
    RESPONSES: {"model": "m", "input": "hi", "store": False},
    MESSAGES: {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
}


def ask(endpoint: str) -> dict[str, Any]:
    return {**BODIES[endpoint], "temperature": 0, "stream": True}


def _chunk(n: int, completions: bool, text: str, finish: str | None = None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if completions:
        choice["text"] = text
    else:
        choice["delta"] = {"content": text} if finish is None else {}
    kind = "text_completion" if completions else "chat.completion.chunk"
    chunk = {"id": "c", "object": kind, "created": 1, "model": "m", "choices": [choice]}
    # Every other event without the space after `data:` (legal SSE; llama.cpp's old servers).
    head = b"data: " if n % 2 else b"data:"
    return b"event: message\nid: %d\n" % n + head + json.dumps(chunk).encode() + b"\n\n"


def _openai(completions: bool) -> list[bytes]:
    return [
        b": keep-alive\n\n",
        b"retry: 3000\n\n",
        _chunk(1, completions, "Hel"),
        b": still here\n\n",
        _chunk(2, completions, "lo"),
        _chunk(3, completions, "", "stop"),
        b"id: 4\ndata: [DONE]\n\n",
    ]


def _typed(n: int, name: str, **data: Any) -> bytes:
    payload = json.dumps({"type": name, **data}).encode()
    return b"id: %d\nevent: " % n + name.encode() + b"\ndata: " + payload + b"\n\n"


STREAMS: dict[str, list[bytes]] = {
    CHAT: _openai(False),
    COMPLETIONS: _openai(True),
    RESPONSES: [
        b": keep-alive\n\n",
        _typed(0, "response.created", response={"id": "resp_1"}, sequence_number=0),
        _typed(1, "response.output_text.delta", delta="Hello", sequence_number=1),
        b"retry: 1000\n\n",
        _typed(2, "response.completed", response={"id": "resp_1"}, sequence_number=2),
    ],
    MESSAGES: [
        _typed(0, "message_start", message={"id": "msg_1"}),
        _typed(1, "ping"),
        _typed(2, "content_block_delta", index=0, delta={"type": "text_delta", "text": "Hello"}),
        b": comment\n\n",
        _typed(3, "message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}),
        _typed(4, "message_stop"),
    ],
}
LINE_ENDS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


def framed(endpoint: str, eol: str) -> list[bytes]:
    """The API's stream with every line ended by `eol`."""
    return [event.replace(b"\n", LINE_ENDS[eol]) for event in STREAMS[endpoint]]


def region(events: list[bytes], release: asyncio.Event | None = None) -> Handler:
    """Streams `events` (after `release`, from the second one)."""

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            for i, event in enumerate(events):
                if i == 1 and release is not None:
                    await release.wait()
                yield event

        return LocalReply(200, SSE, chunks())

    return handle


ENDPOINTS = [CHAT, COMPLETIONS, RESPONSES, MESSAGES]


@pytest.mark.parametrize("eol", list(LINE_ENDS))
@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_a_hit_replays_the_bytes_the_live_relay_sent(endpoint: str, eol: str) -> None:
    events = framed(endpoint, eol)
    async with cached({"a": region(events)}) as (client, _, transports):
        got = []
        for outcome in ("MISS", "HIT"):
            async with client.post(endpoint, json=ask(endpoint)) as resp:
                assert resp.headers["x-cache"] == outcome
                assert resp.headers["Content-Type"] == "text/event-stream"
                got.append(await resp.read())
    assert len(transports["a"].requests) == 1
    miss, hit = got
    # The live relay passes every field and comment on, as the region sent them.
    assert miss == b"".join(events)
    assert hit == miss


async def coalesced(
    make: Callable[[asyncio.Event], Handler], endpoint: str, followers: int
) -> tuple[list[Answer], bytes]:
    """A leader and `followers` coalesced behind it at the region `make(release)` makes (it
    holds its answer until `release`), then a later hit; their answers and the hit's body
    (the region asked once)."""
    release = asyncio.Event()
    async with cached({"a": make(release)}) as (client, cache, transports):
        answers = asyncio.create_task(burst(client, endpoint, ask(endpoint), 1 + followers))
        await joined(cache, followers)
        release.set()
        got = await answers
        # And a later hit, from the entry the flight stored.
        async with client.post(endpoint, json=ask(endpoint)) as resp:
            assert resp.headers["x-cache"] == "HIT"
            hit = await resp.read()
    assert len(transports["a"].requests) == 1
    return got, hit


@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_a_coalesced_follower_gets_the_bytes_its_leader_got(endpoint: str) -> None:
    events = framed(endpoint, "lf")
    got, hit = await coalesced(partial(region, events), endpoint, 2)
    assert sorted(a[3] or "" for a in got) == ["HIT", "HIT", "MISS"]
    for answer in got:
        assert answer[4] == b"".join(events)
    assert hit == b"".join(events)


async def test_a_region_without_done_gets_the_routers_in_the_replay_too() -> None:
    # The live relay adds the [DONE] the region left out; the replay sends that, not the
    # region's bytes alone.
    events = [e for e in framed(CHAT, "lf") if b"[DONE]" not in e]
    async with cached({"a": region(events)}) as (client, _, _):
        got = []
        for outcome in ("MISS", "HIT"):
            async with client.post(CHAT, json=ask(CHAT)) as resp:
                assert resp.headers["x-cache"] == outcome
                got.append(await resp.read())
    miss, hit = got
    assert miss == b"".join(events) + b"data: [DONE]\n\n"
    assert hit == miss


@pytest.mark.parametrize("endpoint", [CHAT, MESSAGES])
async def test_a_last_event_ended_by_lf_then_cr_reaches_followers_and_is_stored(
    endpoint: str,
) -> None:
    # A lone CR after the last line's LF is a blank line (legal SSE), then a stray byte: the
    # relay sends the last event whole; the recorder held it for a CR LF and must let it go.
    events = framed(endpoint, "lf")
    events[-1] = events[-1][:-1] + b"\r\r"
    got, hit = await coalesced(partial(region, events), endpoint, 1)
    live = b"".join(events)[:-1]  # all but the stray CR
    assert [a[4] for a in got] == [live, live]
    assert hit == live


async def test_a_region_that_breaks_after_a_complete_stream_gives_followers_the_whole_answer() -> (
    None
):
    # Every choice finished and [DONE] relayed, then the region's connection reset: the leader's
    # client has a whole answer, and so do its followers (and the entry is stored).
    events = framed(CHAT, "lf")

    def resetting(release: asyncio.Event) -> Handler:
        async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
            async def chunks() -> AsyncIterator[bytes]:
                yield events[0]
                await release.wait()
                for event in events[1:]:
                    yield event
                await asyncio.sleep(0.01)
                raise ConnectionResetError("reset after [DONE]")

            return LocalReply(200, SSE, chunks())

        return handle

    got, hit = await coalesced(resetting, CHAT, 1)
    assert [a[4] for a in got] == [b"".join(events)] * 2
    assert hit == b"".join(events)


def test_entries_of_the_older_format_are_never_read() -> None:
    # Version 1 held a chat stream's data payloads: read as whole events they would replay
    # garbage, and a version-1 router would frame this version's events again. Neither reads
    # the other's keys or envelopes.
    entry = sse_entry(tuple(framed(CHAT, "lf")))
    blob = encode_entry(entry)
    assert blob[2] == VERSION == 2
    assert decode_entry(blob, 1 << 20) == entry
    assert decode_entry(blob[:2] + bytes([1]) + blob[3:], 1 << 20) is None
    assert ":v2:" in redis_key("rc", b"k", "t", "m")
    payloads = sse_entry((b'{"choices":[]}', b"{}"))
    assert not plausible(payloads, namespace="t", model="m", stream=True, max_bytes=1 << 20)


@pytest.mark.parametrize("typed", [False, True], ids=["chat", "typed"])
def test_the_recorder_keeps_every_event_byte_for_byte_however_the_bytes_come(
    typed: bool,
) -> None:
    raw = b"".join(framed(RESPONSES if typed else CHAT, "crlf"))
    for size in (1, 7, len(raw)):
        recorder = StreamRecorder(typed=typed)
        published = []
        for i in range(0, len(raw), size):
            published += recorder.feed(raw[i : i + size])
        assert recorder.complete
        assert recorder.chunks == published
        assert b"".join(recorder.chunks) == raw
        assert all(map(sse.whole_event, recorder.chunks))


def test_what_follows_the_end_of_a_recorded_stream() -> None:
    # A comment after [DONE] was relayed: it is replayed too, and the stream stays complete.
    done = b"".join(framed(CHAT, "lf"))
    recorder = StreamRecorder()
    recorder.feed(done + b": bye\n\n")
    assert recorder.complete
    assert recorder.chunks[-1] == b": bye\n\n"
    # Data after it is not a stream the cache understands; nor is one that ended mid-event.
    for after in (_chunk(9, False, "more"), b"data: [DONE]\n\n", b"id: 9\ndata: {}"):
        recorder = StreamRecorder()
        recorder.feed(done + after)
        assert not recorder.complete, after


def test_a_shared_entry_of_whole_events_is_plausible_and_one_cut_short_is_not() -> None:
    chunks = tuple(framed(MESSAGES, "cr"))
    entry = sse_entry(chunks)
    blob = encode_entry(entry)
    assert decode_entry(blob, 1 << 20) == entry
    assert plausible(entry, namespace="t", model="m", stream=True, max_bytes=1 << 20)
    for bad in ((*chunks[:-1], chunks[-1][:-1]), (b"",), (b"data: {}\n\ndata: {",)):
        cut = sse_entry(bad)
        assert not plausible(cut, namespace="t", model="m", stream=True, max_bytes=1 << 20)


def sse_entry(chunks: tuple[bytes, ...]) -> Any:
    from router.cache.policy import Entry

    return Entry(
        namespace="t",
        model="m",
        content_type="text/event-stream",
        created=1.0,
        expires=2.0,
        chunks=chunks,
        stream=True,
    )
