"""SSE line endings: CR LF, LF and a lone CR each end a line (the WHATWG spec's event stream),
in every parser the router reads a region's stream with, however the stream is cut."""

from __future__ import annotations

import itertools

from router.core.attempt import has_token
from router.core.stream import StreamState, passable, payload_of
from router.net import sse

# A chat stream as regions send it, its lines ended by LF: a comment, a two-line event, a
# typed one, then [DONE].
_LF = (
    b": keep-alive\n\n"
    b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"b"}}]}\n\n'
    b'event: x\ndata: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
PAYLOADS = [
    b'{"choices":[{"index":0,"delta":{"content":"a"}}]}',
    b'{"choices":[{"index":0,\n"delta":{"content":"b"}}]}',
    b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    b"[DONE]",
]
FRAMINGS = {
    "lf": _LF,
    "crlf": _LF.replace(b"\n", b"\r\n"),
    "cr": _LF.replace(b"\n", b"\r"),
    # Lines ended by a lone CR, events by CR CR LF (a CR, then a blank line ended by CR LF).
    "cr-then-crlf": _LF.replace(b"\n", b"\r").replace(b"\r\r", b"\r\r\n"),
}


def pieces(stream: bytes, cuts: tuple[int, ...]) -> list[bytes]:
    """`stream` cut at `cuts` (sorted offsets), as reads would bring it."""
    return [stream[a:b] for a, b in itertools.pairwise((0, *cuts, len(stream)))]


def split(stream: bytes, cuts: tuple[int, ...] = ()) -> list[bytes]:
    """The events a Splitter gives for `stream` read in pieces, its end included."""
    splitter = sse.Splitter(1 << 20)
    events = [event for piece in pieces(stream, cuts) for event in splitter.feed(piece)]
    events += splitter.end()
    assert not splitter.pending
    return events


def decode(stream: bytes, cuts: tuple[int, ...] = ()) -> list[bytes]:
    """The payloads a Decoder gives for `stream` read in pieces."""
    decoder = sse.Decoder()
    payloads = [payload for piece in pieces(stream, cuts) for payload in decoder.feed(piece)]
    assert not decoder.pending
    return payloads


def test_cr_crlf_and_lf_streams_give_the_same_events_and_payloads() -> None:
    for name, stream in FRAMINGS.items():
        assert decode(stream) == PAYLOADS, name
        events = split(stream)
        assert [sse.data_of(event) for event in events] == [None, *PAYLOADS], name
        # The events are the region's bytes as they came (the relay forwards them).
        assert b"".join(events) == stream, name
        assert [sse.data_of(event) for event in sse.split_events(stream)] == [None, *PAYLOADS]
        assert sse.last_boundary(stream) == len(stream), name
        assert sse.last_boundary(stream + b"data: x\r") == len(stream), name


def test_a_stream_cut_at_every_byte_reads_as_the_whole() -> None:
    for name, stream in FRAMINGS.items():
        whole = split(stream)
        for at in range(1, len(stream)):
            # Cut there, and a read of one or two bytes from there (a CR LF, or two CRs, alone).
            for cuts in ((at,), (at, at + 1), (at, at + 2)):
                assert decode(stream, cuts) == PAYLOADS, (name, cuts)
                events = split(stream, cuts)
                if name != "cr-then-crlf":
                    # LF, CR LF and CR: the same events, byte for byte, wherever the cuts.
                    assert events == whole, (name, cuts)
                else:
                    # A CR CR ending a read is an event's end at once: the LF of the CR LF that
                    # follows comes first in the next event's bytes (an empty line there), or
                    # at the stream's end is a blank line left out.
                    assert [sse.data_of(e) for e in events] == [None, *PAYLOADS], (name, cuts)
                    assert b"".join(events) in (stream, stream[:-1]), (name, cuts)


def test_a_cr_ending_one_read_and_an_lf_starting_the_next_are_one_line_ending() -> None:
    # Two data lines of one event, the CR LF between them cut in two: not a blank line.
    decoder = sse.Decoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\ndata: b\r") == []
    assert decoder.feed(b"\n") == []
    assert decoder.pending
    assert decoder.feed(b"\r\n") == [b"a\nb"]
    splitter = sse.Splitter(1 << 20)
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"\ndata: b\r") == []
    assert splitter.feed(b"\n") == []
    assert splitter.feed(b"\r") == []  # a CR LF stream's blank line, its LF still to come
    assert splitter.feed(b"\n") == [b"data: a\r\ndata: b\r\n\r\n"]
    # A lone CR ends the event at once; an LF after it is no second blank line.
    assert decoder.feed(b"data: c\r\r") == [b"c"]
    assert decoder.feed(b"\ndata: d\r") == []
    assert decoder.feed(b"\r") == [b"d"]
    assert splitter.feed(b"data: c\r\r") == [b"data: c\r\r"]
    assert splitter.feed(b"\ndata: d\r") == []
    assert splitter.feed(b"\r") == [b"\ndata: d\r\r"]
    assert not splitter.pending


def test_the_end_of_a_stream_completes_a_last_event_ended_by_cr() -> None:
    splitter = sse.Splitter(1 << 20)
    assert splitter.feed(b"data: a\r\rdata: [DONE]\r") == [b"data: a\r\r"]
    assert splitter.end() == [b"data: [DONE]\r\r"]
    assert not splitter.pending
    # A CR LF stream that ended between its blank line's CR and LF.
    held = sse.Splitter(1 << 20)
    assert held.feed(b"data: [DONE]\r\n\r") == []
    assert held.end() == [b"data: [DONE]\r\n\r\n"]
    cut = sse.Splitter(1 << 20)
    assert cut.feed(b"data: [DO") == []
    assert cut.end() == []
    assert cut.pending


def test_the_first_wanted_event_of_a_cr_stream_is_found() -> None:
    for name, stream in FRAMINGS.items():
        splitter = sse.Splitter(1 << 20)
        found = splitter.first(stream, lambda event: b'"a"' in event)
        assert found is not None, name
        assert sse.data_of(found) == PAYLOADS[0], name
        assert has_token(found), name


def test_the_relay_reads_a_cr_stream_as_it_reads_an_lf_one() -> None:
    for name, stream in FRAMINGS.items():
        state = StreamState()
        events = split(stream)
        # Relayed as the region sent it; every payload read, the stream complete.
        assert passable(events, state, False) == stream, name
        assert (state.complete, state.done, state.owes_done, state.invalid) == (
            True,
            True,
            False,
            0,
        ), name
        assert [payload_of(event) for event in events] == [None, *PAYLOADS], name


def test_a_payload_keeps_no_cr_of_its_line_ending() -> None:
    # An event whose data line ends with CR LF and its blank line with LF: [DONE] is [DONE].
    state = StreamState()
    events = [
        b'data: {"choices":[{"index":0,"finish_reason":"stop"}]}\r\n\n',
        b"data: [DONE]\r\n\n",
    ]
    assert passable(events, state, False) == b"".join(events)
    assert (state.complete, state.done, state.invalid) == (True, True, 0)
    assert payload_of(b"data: [DONE]\r\n\n") == b"[DONE]"
    assert payload_of(b"data: a\rdata: b\n\n") == b"a\nb"


def test_whole_crlf_events_in_one_read_are_cut_as_byte_by_byte() -> None:
    # sse-starlette's framing (llama-cpp-python) in one read takes a shortcut: the same events,
    # also when an empty line follows the last one (it begins the next event) or sits between.
    crlf = FRAMINGS["crlf"]
    for stream in (crlf, crlf + b"\r\n", crlf.replace(b"\r\n\r\n", b"\r\n\r\n\r\n", 2)):
        splitter = sse.Splitter(1 << 20)
        whole = splitter.feed(stream)
        rest = splitter.end()
        assert whole + rest == split(stream, tuple(range(1, len(stream)))), stream


def test_events_of_cuts_whole_events_byte_for_byte() -> None:
    lf = b": hi\n\nretry: 3000\n\nevent: message\nid: 1\ndata: {}\n\ndata: [DONE]\n\n"
    assert sse.events_of(lf) == [
        b": hi\n\n",
        b"retry: 3000\n\n",
        b"event: message\nid: 1\ndata: {}\n\n",
        b"data: [DONE]\n\n",
    ]
    for eol in (b"\r\n", b"\r"):
        framed = lf.replace(b"\n", eol)
        assert sse.events_of(framed) == [e.replace(b"\n", eol) for e in sse.events_of(lf)]
    # Whatever the bytes, joined they are the bytes again: an empty event stays with the one
    # before it, an unended one is a last piece of its own.
    for raw in (b"data: a\n\n\n\ndata: b\n\n", b"\n\ndata: a\r\n\r\ndata: b\n", b"", b"\n"):
        assert b"".join(sse.events_of(raw)) == raw
    # Cut where the relay's Splitter cuts them.
    assert sse.events_of(b"data: a\n\n\n\ndata: b\n\n") == [b"data: a\n\n\n\n", b"data: b\n\n"]
    assert sse.events_of(b"data: a\n\n\ndata: b") == [b"data: a\n\n", b"\ndata: b"]


def test_whole_event_says_where_an_event_ends() -> None:
    for whole in (b"data: a\n\n", b"id: 1\r\ndata: a\r\n\r\n", b"data: a\r\r", b": c\n\n"):
        assert sse.whole_event(whole)
    for cut in (b"", b"data: a", b"data: a\n", b"data: a\n\ndata: b"):
        assert not sse.whole_event(cut)
