"""OpenStreams: each stream that got its first byte is told to every observer once."""

from __future__ import annotations

from router.core.context import RequestContext
from router.core.open_streams import OpenStreams
from router.core.request import CHAT, parse_body


class _Heard:
    """A StreamObserver that notes what it was told, in order."""

    def __init__(self) -> None:
        self.said: list[tuple[str, ...]] = []

    def broke(self, ctx: RequestContext, region: str, model: str) -> None:
        self.said.append(("broke", region, model))

    def went_through(self, ctx: RequestContext, region: str, model: str, ttft_s: float) -> None:
        self.said.append(("through", region, model, str(ttft_s)))

    def ended(self, ctx: RequestContext) -> None:
        self.said.append(("ended",))


def _ctx() -> RequestContext:
    ctx = RequestContext("r", CHAT)
    ctx.parsed = parse_body(
        CHAT, b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}'
    )
    return ctx


def test_each_stream_is_told_once_to_every_observer() -> None:
    one, two = _Heard(), _Heard()
    streams = OpenStreams(one, two)
    ctx = _ctx()
    # a's stream broke, b continued it (its model noted when it opened), a again went through.
    ctx.streaming += [("a", "m", 0.1), ("b", "m-2", 0.2), ("a", "m", 0.3)]
    streams.broke(ctx, "a")  # the latest stream from a
    streams.ended(ctx)
    streams.ended(ctx)  # a second end tells nothing twice
    expected = [
        ("broke", "a", "m"),
        ("through", "a", "m", "0.1"),
        ("through", "b", "m-2", "0.2"),
        ("ended",),
        ("ended",),
    ]
    assert one.said == two.said == expected
    assert ctx.streaming == []


def test_a_break_heard_of_after_the_end_is_still_a_break() -> None:
    heard = _Heard()
    ctx = _ctx()
    OpenStreams(heard).broke(ctx, "a")  # nothing noted open: the request's model
    assert heard.said == [("broke", "a", "m")]
