"""routing.affinity: which region holds each stored response, bounded, per tenant."""

from __future__ import annotations

import pytest

from router.config import StateConfig
from router.errors import NotFound
from router.routing.affinity import ResponseHomes


async def test_homes_remember_the_most_recently_used_per_tenant() -> None:
    homes = ResponseHomes(StateConfig(max_responses=2))
    homes.record("r1", "a", "one")
    homes.record("r2", "b", "one")
    assert await homes.home("r1", "one") == "a"  # r1 is now the most recently used
    homes.record("r3", "c", "one")
    assert await homes.home("r2", "one") is None
    assert await homes.home("r1", "one") == "a"
    assert await homes.home("r3", "one") == "c"
    with pytest.raises(NotFound):
        await homes.home("r3", "two")  # another tenant's response
    assert len(homes) == 2
