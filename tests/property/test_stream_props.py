"""Properties of the chat stream's fast paths: the one-loop `passable` relays, drops and strips
exactly what noting each event's payload one by one (StreamState.note, payload_of) does, and
leaves the same state, over mixed events and over reads of data events of many shapes; the
first-token check agrees with parsing every event."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.attempt import carries_token, has_token
from router.core.stream import StreamState, passable, passable_each
from router.net import sse

_PAYLOADS = st.sampled_from(
    [
        b'{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}',
        b'{"choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}',
        b'{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',
        b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}',
        b'{"usage":{"total_tokens":3}}',
        b'{"error":{"message":"overloaded"}}',
        b'{"choices":"not a list"}',
        b"[DONE]",
        b"not json",
        b'{"cut":',
        b"",
    ]
)
_EVENTS = st.one_of(
    st.builds(lambda p: b"data: " + p + b"\n\n", _PAYLOADS),
    st.builds(lambda p: b"data:" + p + b"\n\n", _PAYLOADS),
    st.builds(lambda p: b"event: chunk\ndata: " + p + b"\r\n\r\n", _PAYLOADS),
    st.just(b": keep-alive\n\n"),
)


def _fields(state: StreamState) -> tuple[object, ...]:
    fields = (state.done, state.held_done, state.finishes, state.invalid, state.usage_only)
    return (*fields, state.error)


# Payloads of the usual read's shape and near it: escaped and duplicate keys, wrong types.
_CHUNK_PAYLOADS = st.sampled_from(
    [
        b'{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}',
        b'{"choices":[{"index":0,"finish_reason":null},{"index":1,"finish_reason":"stop"}]}',
        b'{"choices":[{"index":2,"delta":{}}]}',
        b'{"choices":[{"index":0,"finish_reason":"length"}],"usage":null}',
        b' {"choices":[],"usage":{"completion_tokens":2}} ',
        b'{"us\\u0061ge":{"total_tokens":3}}',
        b'{"choices":null,"usage":{}}',
        b'{"usage":5,"usage":{}}',
        b'{"choices":[{"index":1.0}]}',
        b'{"x":"\xff"}',
        b"[DONE]",
        b"{",
    ]
)


_DATA_EVENTS = st.builds(lambda p: b"data: " + p + b"\n\n", _CHUNK_PAYLOADS)


@settings(max_examples=500, deadline=None)
@given(
    chunks=st.one_of(
        st.lists(st.lists(_EVENTS, max_size=6), max_size=5),
        st.lists(st.lists(_DATA_EVENTS, max_size=6), max_size=5),
    ),
    strip_usage=st.booleans(),
)
def test_one_loop_equals_event_by_event(chunks: list[list[bytes]], strip_usage: bool) -> None:
    fast, slow = StreamState(), StreamState()
    for events in chunks:
        fast_stripped: list[bytes] = []
        slow_stripped: list[bytes] = []
        got = passable(events, fast, strip_usage, fast_stripped)
        assert got == passable_each(events, slow, strip_usage, slow_stripped)
        assert fast_stripped == slow_stripped
        assert _fields(fast) == _fields(slow)
        if fast.error is not None:
            break  # the region's error event ended its stream: the relay reads no further


def _has_token_reference(data: bytes) -> int:
    """The first token's index among all the whole events, each parsed in full."""
    events = sse.split_events(data[: sse.last_boundary(data)])
    for i, payload in enumerate(sse.data_of(e) for e in events):
        if payload and carries_token(payload):
            return i
    return -1


_ROLE = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
_FIRST = st.sampled_from(
    [
        b"data: " + _ROLE + b"\n\n",
        b"data:" + _ROLE + b"\n\n",
        b"data: " + _ROLE + b"\r\n\r\n",
        b": keep-alive\n\n",
        b"retry: 1000\n\n",
        b"id: 7\n\n",
        b"\n\n\n",
        b"data:\n\n",
        b"event: x\ndata: " + _ROLE + b"\n\n",
        b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n',
        b'data: {"error":{"message":"engine crashed"}}\n\n',
        b"data: [DONE]\n\n",
        b"data: not json\n\n",
        b"data: " + _ROLE[:20],
    ]
)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_FIRST, min_size=1, max_size=5), cuts=st.lists(st.integers(0, 400)))
def test_first_token_check_equals_event_parsing(parts: list[bytes], cuts: list[int]) -> None:
    """Read in any pieces, the first token is the one found parsing every event in full;
    comments, other fields, empty data and role preambles are never one."""
    data = b"".join(parts)
    splitter = sse.Splitter(1 << 20)
    events = [event for piece in _pieces(data, cuts) for event in splitter.feed(piece)]
    found = next((i for i, event in enumerate(events) if has_token(event)), -1)
    assert found == _has_token_reference(data)


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
