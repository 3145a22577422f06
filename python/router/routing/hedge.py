"""Hedged attempts: no first byte after a delay, ask the next region too; the first byte wins."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from router.core.context import RequestContext
from router.core.failure import AttemptError
from router.core.stages import AttemptObserver, Gate, Hedger, Opener
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
            try:
                done, _ = await asyncio.wait({primary}, timeout=delay)
                if done or not gate(ctx):
                    return await primary
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
                return await _race(ctx, primary, upstream, backup, open_one, hooks)
            finally:
                if not primary.done():
                    primary.cancel()
                    with contextlib.suppress(BaseException):
                        await primary

        return open_hedged

    return make


async def _race(
    ctx: RequestContext,
    primary: asyncio.Future[Opened],
    first: Upstream,
    backup: Upstream,
    open_one: Opener,
    hooks: Sequence[AttemptObserver],
) -> Opened:
    """First of the two attempts to produce a byte; the loser is cancelled (its request closed).

    When both fail, the failure raised is the one the attempt loop would have ended with had it
    asked the two in turn: the primary's when it may not be retried, else the backup's (a
    region's own answer rather than the primary's silence). The loop observes the raised one;
    every other failure is observed here, against its own region."""
    began = time.perf_counter()
    secondary = asyncio.ensure_future(open_one(backup))
    region = {primary: first, secondary: backup}
    pending: set[asyncio.Future[Opened]] = {primary, secondary}
    errors: dict[asyncio.Future[Opened], tuple[AttemptError, float]] = {}

    def observe_all_but(raised: asyncio.Future[Opened] | None) -> None:
        for task, (err, seconds) in errors.items():
            if task is not raised:
                for hook in hooks:
                    hook(ctx, region[task], err, seconds)

    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if exc is None:
                    winner = task.result()
                    ctx.region = winner.upstream.name
                    observe_all_but(None)
                    return winner
                if not isinstance(exc, AttemptError):
                    raise exc
                errors[task] = (exc, time.perf_counter() - began)
        raised = primary if not errors[primary][0].retryable else secondary
        observe_all_but(raised)
        ctx.region = region[raised].name
        raise errors[raised][0]
    finally:
        for task in pending:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
