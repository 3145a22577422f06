"""The simulated region's injected delays are lower bounds, even when timers fire early."""

from __future__ import annotations

import pytest

from router.sim import server


async def test_pause_waits_its_whole_delay_when_timers_fire_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A clock of its own, so how busy the machine is cannot decide the outcome.
    now = [100.0]
    asked: list[float] = []

    async def early(delay: float) -> None:
        # A timer that fires at 60% of its delay (the loop's clock is coarse or stale).
        asked.append(delay)
        now[0] += delay * 0.6

    monkeypatch.setattr(server.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(server.asyncio, "sleep", early)
    await server._pause(0.05)
    assert now[0] >= 100.0 + 0.05  # the same sum the pause computes its deadline with
    assert len(asked) > 1  # it went back to sleep for what was left


async def test_no_delay_does_not_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(delay: float) -> None:
        raise AssertionError("slept")

    monkeypatch.setattr(server.asyncio, "sleep", never)
    await server._pause(0)
    await server._pause(-1)
