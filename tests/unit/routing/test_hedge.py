"""Hedging's use of the retry gate: a hedge is never a free retry."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from router.core.context import RequestContext
from router.routing.hedge import hedger

CHAT = "/v1/chat/completions"


@dataclass
class Region:
    name: str


async def test_a_hedge_asks_the_gate_as_a_paid_retry_whatever_came_before() -> None:
    # The attempt before the primary failed to connect (a free retry for the primary); the
    # hedge the primary's silence starts sends the request to a second region while the first
    # may still answer: the gate must see it as a retry the budget pays for.
    ctx = RequestContext("r", CHAT)
    ctx.free_retry = True
    seen: list[bool] = []

    def gate(c: RequestContext) -> bool:
        seen.append(c.free_retry)
        return False  # no budget: the primary goes on alone

    async def open_one(upstream: Any) -> Any:
        await asyncio.sleep(0.05)
        return upstream.name

    async def discard(opened: Any) -> None:
        return None

    make = hedger(lambda: (CHAT,), lambda region: 0.001)
    regions = [Region("a"), Region("b")]
    opener = make(ctx, regions, open_one, (), gate, discard)  # type: ignore[arg-type]
    assert await opener(regions[0]) == "a"  # type: ignore[arg-type]
    assert seen == [False]
