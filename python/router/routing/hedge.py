"""Hedged attempts: no first byte after a delay, ask the next region too; the first byte wins."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from router.core.context import RequestContext
from router.core.failure import AttemptError
from router.core.stages import AttemptObserver, Discard, Gate, Hedger, Opener
from router.core.upstream import Opened, Upstream

log = logging.getLogger("router")

# The delay before hedging the attempt at a region, or None to not hedge it (no data yet).
DelayOf = Callable[[str], float | None]


def hedger(endpoints: Callable[[], Sequence[str]], delay_of: DelayOf) -> Hedger:
    """Hedge requests to the endpoints `endpoints()` names now; others keep the plain opener."""

    def make(
        ctx: RequestContext,
        candidates: Sequence[Upstream],
        open_one: Opener,
        hooks: Sequence[AttemptObserver],
        gate: Gate,
        discard: Discard,
    ) -> Opener:
        if ctx.endpoint not in endpoints():
            return open_one
        tried: set[str] = set()

        async def open_hedged(upstream: Upstream) -> Opened:
            tried.add(upstream.name)
            backup = next((u for u in candidates if u.name not in tried), None)
            delay = delay_of(upstream.name)
            if backup is None or delay is None:
                return await open_one(upstream)
            primary = asyncio.ensure_future(open_one(upstream))
            # Whether the primary's outcome went to the caller (or to the race, which then
            # answers for it): otherwise it is dropped, however this ends.
            handed = False
            try:
                done, _ = await asyncio.wait({primary}, timeout=delay)
                # A hedge sends the request to a second region while the first may still
                # answer: never a free retry, whatever the attempt before the primary was.
                ctx.free_retry = False
                if done or not gate(ctx):
                    opened = await primary
                    handed = True
                    return opened
                tried.add(backup.name)
                ctx.attempts += 1
                ctx.hedged = backup.name
                log.info(
                    "request %s: no first byte from %s in %.3fs, hedging on %s",
                    ctx.request_id,
                    upstream.name,
                    delay,
                    backup.name,
                )
                handed = True
                return await _race(ctx, primary, upstream, backup, open_one, hooks, discard)
            finally:
                if not handed:
                    await _drop(primary, discard)

        return open_hedged

    return make


async def _drop(task: asyncio.Future[Opened], discard: Discard) -> None:
    """An attempt whose answer nobody will use: cancelled while it runs (its request closed,
    its slot given back by the attempt path), or, if it already got an answer, that answer
    let go of (its connection closed, its slot given back). A pooled connection left to an
    answer nobody reads would be held for good."""
    if not task.done():
        task.cancel()
        # Not `await task`: that would swallow this task's own cancellation with the attempt's.
        await asyncio.wait({task})
    if not task.cancelled() and task.exception() is None:
        discard(task.result())


async def _race(
    ctx: RequestContext,
    primary: asyncio.Future[Opened],
    first: Upstream,
    backup: Upstream,
    open_one: Opener,
    hooks: Sequence[AttemptObserver],
    discard: Discard,
) -> Opened:
    """First of the two attempts to produce a byte; the other is cancelled, or let go of if it
    got its answer too (both can come in the same turn of the event loop: the primary wins).

    When both fail, the failure raised is the one the attempt loop would have ended with had it
    asked the two in turn: the primary's when it may not be retried, else the backup's (a
    region's own answer rather than the primary's silence). The loop observes the raised one;
    every other failure is observed here, against its own region. Whichever way the race ends
    (an answer, two failures, the request cancelled, an error), every attempt but the one
    returned is dropped."""
    began = time.perf_counter()
    secondary = asyncio.ensure_future(open_one(backup))
    region = {primary: first, secondary: backup}
    errors: dict[asyncio.Future[Opened], tuple[AttemptError, float]] = {}
    # The attempt whose answer is returned: the only one not dropped.
    kept: asyncio.Future[Opened] | None = None

    def observe_all_but(raised: asyncio.Future[Opened] | None) -> None:
        for task, (err, seconds) in errors.items():
            if task is not raised:
                for hook in hooks:
                    hook(ctx, region[task], err, seconds)

    try:
        winner: asyncio.Future[Opened] | None = None
        pending: set[asyncio.Future[Opened]] = {primary, secondary}
        while pending and winner is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in (primary, secondary):
                if task not in done:
                    continue
                exc = task.exception()
                if exc is None:
                    if winner is None:
                        winner = task
                    continue
                if not isinstance(exc, AttemptError):
                    raise exc
                errors[task] = (exc, time.perf_counter() - began)
        if winner is not None:
            opened = winner.result()
            ctx.region = opened.upstream.name
            observe_all_but(None)
            kept = winner
            return opened
        raised = primary if not errors[primary][0].retryable else secondary
        observe_all_but(raised)
        ctx.region = region[raised].name
        raise errors[raised][0]
    finally:
        for task in (primary, secondary):
            if task is not kept:
                await _drop(task, discard)
