"""SSE decoding does not depend on how the stream was cut into chunks."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from router.net import sse

_ATOMS = st.sampled_from(
    [b"data: ", b"data:", b"x", b'{"a":1}', b"\n", b"\r\n", b"\r", b": c\n", b"event: e\n", b" "]
)


@given(st.lists(_ATOMS, max_size=40).map(b"".join), st.lists(st.integers(0, 400), max_size=8))
def test_any_chunking_decodes_as_the_whole(stream: bytes, cuts: list[int]) -> None:
    whole = sse.Decoder()
    expected = whole.feed(stream)
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    chunked = sse.Decoder()
    got = [payload for piece in pieces for payload in chunked.feed(piece)]
    assert got == expected
    assert chunked.pending == whole.pending


def test_events_split_mid_line_and_crlf() -> None:
    d = sse.Decoder()
    assert d.feed(b'data: {"a"') == []
    # The blank line that ends the event is itself cut after its \r: a CR ends a line, so the
    # event is whole there; the LF that follows is the rest of that CR LF, not a second line.
    assert d.feed(b":1}\r\n\r") == [b'{"a":1}']
    assert not d.pending
    assert d.feed(b"\ndata: [DONE]\n\n") == [b"[DONE]"]
    assert not d.pending


@given(st.lists(_ATOMS | st.just(b"\n\n"), max_size=40).map(b"".join), st.integers(0, 400))
def test_fast_path_matches_the_line_parser(stream: bytes, cut: int) -> None:
    # The "\n\n" block fast path must decode exactly what the general line parser does.
    fast, lines = sse.Decoder(), sse.Decoder()
    head, tail = stream[:cut], stream[cut:]
    got = fast.feed(head) + fast.feed(tail)
    reference = lines._lines(head)
    reference += lines._lines(lines._buf + tail)
    assert got == reference
    assert fast.pending == lines.pending


_LINE = st.sampled_from(
    [b"data: ", b"data:", b"x", b'{"a":1}', b": c", b"event: e", b" ", b"id: 1"]
)


@given(st.lists(st.lists(_LINE, min_size=1, max_size=4).map(b"".join), min_size=1, max_size=4))
def test_data_of_one_event_is_what_the_decoder_reads(lines: list[bytes]) -> None:
    event = b"\n".join(line.replace(b"\n", b"") for line in lines)
    decoded = sse.Decoder().feed(event + b"\n\n")
    assert sse.data_of(event) == (decoded[0] if decoded else None)


@given(
    st.lists(_ATOMS | st.just(b"\n\n"), max_size=40).map(b"".join),
    st.lists(st.integers(0, 400), max_size=8),
)
def test_splitter_events_decode_as_the_stream_does(stream: bytes, cuts: list[int]) -> None:
    # Whole events, however the stream is cut, carry exactly what the decoder reads from it.
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    splitter = sse.Splitter(1 << 20)
    events = [event for piece in pieces for event in splitter.feed(piece)]
    whole = b"".join(events)
    expected = sse.Decoder().feed(stream)
    got = sse.Decoder().feed(whole)
    assert got == expected[: len(got)]
    decoder = sse.Decoder()
    decoder.feed(stream)
    if not decoder.pending:
        assert got == expected


def test_splitter_bounds_one_event() -> None:
    splitter = sse.Splitter(64)
    assert splitter.feed(b"data: " + b"x" * 40) == []
    try:
        splitter.feed(b"y" * 40)
    except sse.EventTooLarge:
        pass
    else:
        raise AssertionError("a 86-byte event passed a 64-byte bound")
    # Whole in one read, ending the read or followed by part of the next event (not on the
    # one-split path): bounded all the same.
    for read in (b"data: " + b"x" * 100 + b"\n\n", b"data: " + b"x" * 100 + b"\n\ndata: y"):
        try:
            sse.Splitter(64).feed(read)
        except sse.EventTooLarge:
            pass
        else:
            raise AssertionError(f"a whole oversized event passed: {read[-12:]!r}")


@given(
    st.lists(_ATOMS | st.just(b"\n\n") | st.just(b"\r\n\r\n"), max_size=40).map(b"".join),
    st.lists(st.integers(0, 400), max_size=8),
    st.integers(16, 120),
)
def test_an_event_over_the_bound_is_refused_however_the_stream_is_cut(
    stream: bytes, cuts: list[int], bound: int
) -> None:
    # The same bytes pass or fail the same way whether they come whole or in pieces: an event
    # (its blank line included) over the bound raises, one within it does not.
    def split(points: list[int]) -> bool:
        pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
        splitter = sse.Splitter(bound)
        try:
            for piece in pieces:
                splitter.feed(piece)
        except sse.EventTooLarge:
            return False
        return True

    whole = split([])
    assert split(sorted({min(c, len(stream)) for c in cuts})) == whole
    assert split(list(range(1, len(stream)))) == whole


@given(st.lists(_ATOMS | st.just(b"\n\n"), max_size=40).map(b"".join))
def test_decoded_payloads_encoded_again_decode_to_themselves(stream: bytes) -> None:
    # What the cache stores (payloads) and replays (encoded): a payload of several data lines
    # must come back whole, each line with its own `data:` prefix.
    payloads = sse.Decoder().feed(stream + b"\n\n")
    # A line's last CR ends the line in SSE: data cannot end in one (nor did a region send it so).
    assume(not any(line.endswith(b"\r") for p in payloads for line in p.split(b"\n")))
    assert sse.Decoder().feed(b"".join(map(sse.encode, payloads))) == payloads


def test_the_end_of_a_stream_completes_an_event_missing_only_its_blank_line() -> None:
    splitter = sse.Splitter(1 << 20)
    assert splitter.feed(b'data: {"a":1}\n\ndata: [DONE]\n') == [b'data: {"a":1}\n\n']
    assert splitter.end() == [b"data: [DONE]\n\n"]
    assert not splitter.pending
    cut = sse.Splitter(1 << 20)
    cut.feed(b'data: {"a"')
    assert cut.end() == []
    assert cut.pending  # a cut event stays cut
    stray = sse.Splitter(1 << 20)
    stray.feed(b"data: [DONE]\n\n\n")
    assert stray.end() == []
    assert not stray.pending


@given(
    st.lists(_ATOMS | st.just(b"\n\n") | st.just(b"data: t\n\n"), max_size=40).map(b"".join),
    st.lists(st.integers(0, 400), max_size=8),
)
def test_splitter_first_finds_the_first_wanted_event_feed_would_give(
    stream: bytes, cuts: list[int]
) -> None:
    # What a stream's first token is read with: the event feed() gives first that is wanted.
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    fed = sse.Splitter(1 << 20)
    events = [event for piece in pieces for event in fed.feed(piece)]
    expected = next((e for e in events if b"data: t" in e), None)
    lazy = sse.Splitter(1 << 20)
    found = None
    for piece in pieces:
        found = lazy.first(piece, lambda event: b"data: t" in event)
        if found is not None:
            break
    # The same event (feed's fast path may have left a lone blank line's LF on its front).
    assert (found is None) == (expected is None)
    if found is not None and expected is not None:
        assert sse.data_of(found) == sse.data_of(expected)
