"""A region's stream at the edges of SSE, in process (LocalTransport, each reply piece one read):
what counts as its first token, how its start and end are read, its error events, bytes that
are not UTF-8, and a preamble that never ends. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from router.config import RoutingConfig
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind, health_outcome
from router.core.request import CHAT, MESSAGES, RESPONSES
from router.core.stream import payload_of
from router.core.transport import LocalReply
from router.core.upstream import Upstream
from router.routing.continuation import MidstreamPolicy, StreamTracker
from tests.unit.core.test_event_streams import OPENING, ev, events_of
from tests.unit.core.test_failures import finish, payloads, role, scripted, stream
from tests.unit.core.test_pipeline import SSE, Handler, Seen, app_for, body, delta, event

DONE = b"data: [DONE]\n\n"
WHOLE = [role(), delta("Hel"), delta("lo"), finish(), DONE]
ERROR = event({"error": {"message": "engine crashed", "type": "server_error", "code": 500}})


class Attempted:
    """An attempt observer keeping how each attempt went: (region, failure or None)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, AttemptError | None]] = []

    def __call__(
        self, ctx: RequestContext, upstream: Upstream, error: AttemptError | None, seconds: float
    ) -> None:
        self.seen.append((upstream.name, error))


async def ask(
    regions: dict[str, Handler],
    routing: RoutingConfig | None = None,
    endpoint: str = CHAT,
    payload: dict[str, Any] | None = None,
) -> tuple[int, bytes, dict[str, str], RequestContext, Attempted]:
    """One stream request: its status, body, headers, context and attempts."""
    seen, attempted = Seen(), Attempted()
    app, _ = app_for(regions, routing, filters=(seen,), observers=(attempted,))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(endpoint, json=payload or body(stream=True))
        raw = await resp.read()
        # The access record is written once the handler ends: after the body's last byte.
        await asyncio.sleep(0)
        return resp.status, raw, dict(resp.headers), seen.contexts[-1], attempted


def text_of(raw: bytes) -> str:
    return "".join(
        (c.get("delta") or {}).get("content") or ""
        for p in payloads(raw)
        if p != b"[DONE]"
        for c in json.loads(p).get("choices") or []
    )


def errors_of(raw: bytes) -> list[str]:
    return [json.loads(p)["error"]["message"] for p in payloads(raw) if b'"error"' in p]


# --- 2. A finished stream is complete whatever unended bytes follow it.


async def test_a_stray_newline_after_a_complete_stream_cuts_nothing() -> None:
    routing = RoutingConfig(midstream="resume")
    a = scripted(stream(*WHOLE, 0.01, b"\n"))
    b = scripted(stream(delta("EXTRA"), finish(), DONE))
    status, raw, headers, ctx, _ = await ask({"a": a, "b": b}, routing)
    assert (status, headers["x-router-region"], headers["x-router-attempts"]) == (200, "a", "1")
    assert raw.endswith(DONE)
    assert errors_of(raw) == []
    assert ctx.broken is None


@pytest.mark.parametrize("midstream", ["resume", "error"])
async def test_done_without_its_blank_line_ends_a_finished_stream(midstream: str) -> None:
    a = scripted(stream(role(), delta("Hel"), delta("lo"), finish(), b"data: [DONE]\n"))
    b = scripted(stream(delta(" EXTRA"), finish(), DONE))
    status, raw, headers, ctx, _ = await ask({"a": a, "b": b}, RoutingConfig(midstream=midstream))
    # Never carried on elsewhere (text after finish_reason=stop, charged twice), never an error.
    assert (status, headers["x-router-attempts"]) == (200, "1")
    assert text_of(raw) == "Hello"
    assert payloads(raw).count(b"[DONE]") == 1
    assert raw.endswith(DONE)
    assert errors_of(raw) == []
    assert ctx.broken is None


async def test_a_typed_streams_terminal_event_without_its_blank_line_ends_it() -> None:
    stop = ev("message_stop").removesuffix(b"\n")
    start = ev("message_start", message={"id": "msg_1"})
    text = ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})
    region = scripted(stream(start, text, stop))
    ask_messages = {
        "model": "m",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    status, raw, _, ctx, _ = await ask({"a": region}, endpoint=MESSAGES, payload=ask_messages)
    assert status == 200
    assert [e["type"] for e in events_of(raw)] == [
        "message_start",
        "content_block_delta",
        "message_stop",
    ]
    assert ctx.broken is None


def test_a_finished_streams_resume_neither_reports_nor_continues() -> None:
    reported: list[tuple[str, str]] = []
    policy = MidstreamPolicy("resume", max_resumes=1, report=lambda r, o: reported.append((r, o)))
    tracker = StreamTracker()
    tracker.feed(delta("Hello") + finish() + DONE)
    ctx = RequestContext("r", CHAT)
    ctx.region, ctx.tracker = "a", tracker

    async def never(upstream: Upstream, raw: bytes) -> Any:
        raise AssertionError("a finished stream is carried on nowhere")

    async def write(data: bytes) -> None:
        raise AssertionError("nothing is written")

    assert not asyncio.run(policy.resume(ctx, write, never, "stray bytes", 1.0))
    assert reported == []


# --- 3. Comments, other fields and role preambles are no first token.


@pytest.mark.parametrize(
    "filler",
    [b": keep-alive\n\n", b"retry: 1000\n\n", b"id: 7\n\n", b"event: ping\n\n", b"\n\n"],
    ids=["comment", "retry", "id", "event", "blank"],
)
async def test_a_region_sending_no_token_in_time_is_left_whatever_it_sends(filler: bytes) -> None:
    routing = RoutingConfig(stream_ttft_timeout_s=0.2)
    # Something every 20 ms, its first token only after 2 s.
    slow = scripted(stream(*[b for _ in range(100) for b in (filler, 0.02)], *WHOLE))
    fast = scripted(stream(role(), delta("on time"), finish(), DONE))
    status, raw, headers, _, attempted = await ask({"a": slow, "b": fast}, routing)
    assert (status, headers["x-router-region"]) == (200, "b")
    assert text_of(raw) == "on time"
    (a, error), (b, ok) = attempted.seen
    assert (a, b, ok) == ("a", "b", None)
    assert error is not None
    assert error.kind == FailureKind.TIMEOUT


# --- 4. An error event before any token is a failed attempt; after, a break.


async def test_an_error_event_before_any_token_fails_over_as_a_server_error() -> None:
    a = scripted(stream(role(), ERROR, DONE))
    b = scripted(stream(*WHOLE))
    status, raw, headers, _, attempted = await ask({"a": a, "b": b})
    assert (status, headers["x-router-region"]) == (200, "b")
    assert text_of(raw) == "Hello"
    assert errors_of(raw) == []
    (_, error), _ = attempted.seen
    assert error is not None
    assert error.kind == FailureKind.STATUS
    assert health_outcome(error.kind, error.status) == "server_error"


async def test_an_error_event_from_every_region_is_the_regions_error() -> None:
    async def failing(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return stream(ERROR, DONE)

    status, raw, _, _, attempted = await ask({"a": failing})
    assert status == 502
    assert json.loads(raw)["error"]["message"] == "engine crashed"
    # The only region, tried again as after a 5xx.
    assert [name for name, _ in attempted.seen] == ["a", "a"]


async def test_an_error_event_blaming_the_request_is_returned_and_tried_nowhere_else() -> None:
    refused = event({"error": {"message": "bad schema", "type": "invalid_request_error"}})
    b = scripted(stream(*WHOLE))
    status, raw, _, _, attempted = await ask({"a": scripted(stream(refused, DONE)), "b": b})
    assert status == 400
    assert json.loads(raw)["error"]["message"] == "bad schema"
    assert [name for name, _ in attempted.seen] == ["a"]


async def test_an_error_event_mid_stream_is_a_break_recorded_as_failed() -> None:
    region = scripted(stream(role(), delta("Hel"), ERROR, DONE))
    status, raw, _, ctx, _ = await ask({"a": region})
    assert status == 200
    assert text_of(raw) == "Hel"
    # One error event, the router's (naming the region's words), never the region's, no [DONE].
    assert errors_of(raw) == ["The region stopped mid-stream (error event: engine crashed)."]
    assert b"[DONE]" not in raw
    assert ctx.broken == "The region stopped mid-stream (error event: engine crashed)."


async def test_an_error_event_mid_stream_is_continued_elsewhere() -> None:
    routing = RoutingConfig(midstream="resume")
    a = scripted(stream(role(), delta("Hel"), ERROR, DONE))
    b = scripted(stream(role(), delta("lo"), finish(), DONE))
    status, raw, _, ctx, attempted = await ask({"a": a, "b": b}, routing)
    assert status == 200
    assert text_of(raw) == "Hello"
    assert errors_of(raw) == []
    assert ctx.broken is None
    assert [name for name, _ in attempted.seen] == ["a", "b"]


@pytest.mark.parametrize(
    ("endpoint", "failure"),
    [(RESPONSES, "response.failed"), (MESSAGES, "error")],
)
async def test_a_typed_stream_ended_by_its_failure_event_is_recorded_as_failed(
    endpoint: str, failure: str
) -> None:
    if endpoint == RESPONSES:
        events = [*OPENING, ev("response.output_text.delta", delta="Hi"), ev(failure, response={})]
        payload: dict[str, Any] = {"model": "m", "input": "hi", "store": False, "stream": True}
    else:
        text = {"type": "text_delta", "text": "Hi"}
        events = [ev("message_start", message={"id": "m"}), ev("content_block_delta", delta=text)]
        events.append(ev(failure, error={"type": "overloaded_error", "message": "busy"}))
        payload = {"model": "m", "max_tokens": 5, "stream": True, "messages": body()["messages"]}
    status, raw, _, ctx, _ = await ask(
        {"a": scripted(stream(*events))}, endpoint=endpoint, payload=payload
    )
    assert status == 200
    assert events_of(raw)[-1]["type"] == failure  # the region's own end, relayed
    assert ctx.broken is not None


def _typed(endpoint: str, *events: bytes) -> tuple[list[bytes], dict[str, Any]]:
    """A typed-event stream (its opening, then `events`) and the request asking for it."""
    if endpoint == RESPONSES:
        return [*OPENING, *events], {"model": "m", "input": "hi", "store": False, "stream": True}
    start = [ev("message_start", message={"id": "m"}), ev("content_block_start", index=0)]
    messages = body()["messages"]
    return [*start, *events], {"model": "m", "max_tokens": 5, "stream": True, "messages": messages}


def _whole(endpoint: str) -> list[bytes]:
    if endpoint == RESPONSES:
        done = ev("response.completed", response={"id": "resp_2", "status": "completed"})
        return [ev("response.output_text.delta", delta="Hi"), done]
    text = {"type": "text_delta", "text": "Hi"}
    return [ev("content_block_delta", index=0, delta=text), ev("message_stop")]


# The region's fault: its error event (each API's shape) or its failed response.
REGION_FAULTS = [
    (RESPONSES, ev("error", code="server_error", message="engine crashed", param=None)),
    (RESPONSES, ev("error", code="rate_limit_exceeded", message="slow down", param=None)),
    (
        RESPONSES,
        ev(
            "response.failed",
            response={"id": "resp_1", "status": "failed", "error": {"code": "server_error"}},
        ),
    ),
    (MESSAGES, ev("error", error={"type": "overloaded_error", "message": "Overloaded"})),
    (MESSAGES, ev("error", error={"type": "api_error", "message": "Internal server error"})),
    (MESSAGES, ev("error", error={"type": "rate_limit_error", "message": "slow down"})),
]


@pytest.mark.parametrize(("endpoint", "failure"), REGION_FAULTS)
async def test_a_typed_streams_failure_before_any_token_fails_over_when_the_regions(
    endpoint: str, failure: bytes
) -> None:
    events, payload = _typed(endpoint, failure)
    good, _ = _typed(endpoint, *_whole(endpoint))
    a, b = scripted(stream(*events)), scripted(stream(*good))
    status, raw, headers, ctx, attempted = await ask(
        {"a": a, "b": b}, endpoint=endpoint, payload=payload
    )
    assert (status, headers["x-router-region"]) == (200, "b")
    kinds = [e["type"] for e in events_of(raw)]
    assert kinds[-1] == ("response.completed" if endpoint == RESPONSES else "message_stop")
    assert "error" not in kinds
    assert "response.failed" not in kinds
    assert ctx.broken is None
    (_, error), (_, fine) = attempted.seen
    assert error is not None
    assert fine is None
    assert error.kind == FailureKind.STATUS
    # A rate limit is the region busy, as its 429 says (neutral: no failure of its health, its
    # circuit, its canary version); any other fault fails it, as a 5xx does.
    busy = b"rate_limit" in failure
    assert error.status == (429 if busy else 502)
    assert health_outcome(error.kind, error.status) == ("neutral" if busy else "server_error")


@pytest.mark.parametrize(("endpoint", "failure"), REGION_FAULTS[:1] + REGION_FAULTS[3:4])
async def test_a_typed_streams_failure_from_every_region_is_the_regions_error(
    endpoint: str, failure: bytes
) -> None:
    events, payload = _typed(endpoint, failure)

    async def failing(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        return stream(*events)

    status, raw, _, _, attempted = await ask({"a": failing}, endpoint=endpoint, payload=payload)
    assert status == 502
    error = json.loads(raw)["error"]
    assert error["message"] in ("engine crashed", "Overloaded")
    if endpoint == MESSAGES:
        assert json.loads(raw)["type"] == "error"  # in Anthropic's shape
    # The only region, tried again as after a 5xx.
    assert [name for name, _ in attempted.seen] == ["a", "a"]


@pytest.mark.parametrize(
    ("endpoint", "failure"),
    [
        (RESPONSES, ev("error", code="invalid_prompt", message="bad prompt", param="input")),
        (
            RESPONSES,
            ev(
                "response.failed",
                response={"id": "r", "status": "failed", "error": {"code": "invalid_image"}},
            ),
        ),
        (MESSAGES, ev("error", error={"type": "invalid_request_error", "message": "bad"})),
    ],
)
async def test_a_typed_streams_failure_blaming_the_request_is_relayed(
    endpoint: str, failure: bytes
) -> None:
    events, payload = _typed(endpoint, failure)
    b = scripted(stream(*_typed(endpoint, *_whole(endpoint))[0]))
    status, raw, headers, ctx, attempted = await ask(
        {"a": scripted(stream(*events)), "b": b}, endpoint=endpoint, payload=payload
    )
    assert (status, headers["x-router-region"]) == (200, "a")
    assert events_of(raw)[-1] == json.loads(payload_of(failure) or b"")
    assert ctx.broken is not None
    assert [name for name, _ in attempted.seen] == ["a"]


# --- 5. The stream's start: judged on a whole line, after a byte order mark.


async def test_a_first_read_cut_inside_the_field_name_is_a_stream() -> None:
    first = b"".join(WHOLE)
    status, raw, _, _, _ = await ask({"a": scripted(stream(first[:2], 0.01, first[2:]))})
    assert status == 200
    assert text_of(raw) == "Hello"
    assert raw.endswith(DONE)


async def test_a_stream_starting_with_a_byte_order_mark_is_relayed_without_it() -> None:
    status, raw, _, _, _ = await ask({"a": scripted(stream(b"\xef\xbb\xbf" + b"".join(WHOLE)))})
    assert status == 200
    assert raw.startswith(b"data: ")
    assert text_of(raw) == "Hello"


async def test_a_first_line_that_is_no_sse_field_is_still_refused() -> None:
    page = stream(b"<html>", 0.01, b"<body>502 Bad Gateway</body>\n")
    status, _, _, _, attempted = await ask({"a": scripted(page)})
    assert status == 502
    assert {e.kind for _, e in attempted.seen if e is not None} == {FailureKind.INVALID}


# --- 6. An event that is not UTF-8 is not JSON: dropped.


async def test_an_event_that_is_not_utf8_is_dropped() -> None:
    bad = b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfeBAD"}}]}\n\n'
    status, raw, _, _, _ = await ask(
        {"a": scripted(stream(role(), delta("A"), bad, delta("C"), finish(), DONE))}
    )
    assert status == 200
    assert b"\xff" not in raw
    raw.decode()  # what an SDK does with it
    assert text_of(raw) == "AC"


async def test_a_typed_event_that_is_not_utf8_is_dropped() -> None:
    bad = ev("response.output_text.delta", delta="?").replace(b"?", b"\xff")
    events = [
        *OPENING,
        ev("response.output_text.delta", delta="Hi"),
        bad,
        ev("response.completed", response={}),
    ]
    payload = {"model": "m", "input": "hi", "store": False, "stream": True}
    status, raw, _, _, _ = await ask(
        {"a": scripted(stream(*events))}, endpoint=RESPONSES, payload=payload
    )
    assert status == 200
    assert b"\xff" not in raw
    assert [e["type"] for e in events_of(raw)][-2:] == [
        "response.output_text.delta",
        "response.completed",
    ]


# --- 7. What comes before the first token is bounded.


async def test_a_preamble_that_never_ends_fails_the_attempt_once_past_its_bound() -> None:
    flood = role() * (65536 // len(role()))

    async def region(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(80):  # 5 MiB of role preambles, never a token
                yield flood
                await asyncio.sleep(0)

        return LocalReply(200, SSE, chunks())

    b = scripted(stream(*WHOLE))
    status, raw, headers, _, attempted = await ask({"a": region, "b": b})
    assert (status, headers["x-router-region"]) == (200, "b")
    assert text_of(raw) == "Hello"
    assert len(raw) < 4096  # none of the flood reached the client
    (_, error), _ = attempted.seen
    assert error is not None
    assert error.kind == FailureKind.INVALID
    assert "no first token" in str(error)
