"""A request's streams between their first byte and their end, resolved once for every
StreamObserver (pingora's `logging` phase sees the outcome; here the outcome of each stream)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.core.context import RequestContext
    from router.core.stages import StreamObserver


class OpenStreams:
    """Streams whose first byte came (`ctx.streaming`, noted by the attempt path) end here:
    `broke` when the mid-stream policy or a background reader saw one break, every other one
    went through when the request's attempts are over (`ended`). Each is told to every
    observer once, whoever asks."""

    __slots__ = ("observers",)

    def __init__(self, *observers: StreamObserver) -> None:
        self.observers = observers

    def broke(self, ctx: RequestContext, region: str) -> None:
        """The stream from `region` broke after its first byte."""
        streaming = ctx.streaming
        model = ctx.request.upstream_model
        for i in range(len(streaming) - 1, -1, -1):
            if streaming[i][0] == region:
                model = streaming.pop(i)[1]
                break
        for observer in self.observers:
            observer.broke(ctx, region, model)

    def ended(self, ctx: RequestContext) -> None:
        """The request's attempts are over: each stream that did not break went through (or
        its client left, which says nothing against the region). A stream read on after its
        client left (`ctx.background`, for the cache's other readers) ends when that reader
        is done, which reports a break it sees first."""
        later = ctx.background
        if later is not None and not later.done():
            ctx.background = None
            later.add_done_callback(lambda _: self.ended(ctx))
            return
        streaming = ctx.streaming
        observers = self.observers
        if streaming:
            ctx.streaming = []
            for region, model, ttft_s in streaming:
                for observer in observers:
                    observer.went_through(ctx, region, model, ttft_s)
        for observer in observers:
            observer.ended(ctx)
