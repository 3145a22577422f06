"""routing.affinity: which region holds each stored response, bounded, per tenant."""

from __future__ import annotations

import random
from collections import Counter

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


async def test_a_tenant_making_many_responses_pushes_out_only_its_own() -> None:
    homes = ResponseHomes(StateConfig(max_responses=10))
    for i in range(3):
        homes.record(f"quiet{i}", "a", "quiet")
    for i in range(1000):
        homes.record(f"busy{i}", "b", "busy")
    # The quiet tenant's notes all stay; the busy one keeps its most recent within the rest.
    assert [await homes.home(f"quiet{i}", "quiet") for i in range(3)] == ["a"] * 3
    kept = [i for i in range(1000) if await homes.home(f"busy{i}", "busy") is not None]
    assert kept == list(range(993, 1000))
    assert len(homes) == 10


async def test_past_the_bound_the_heaviest_tenant_gives_up_its_oldest() -> None:
    homes = ResponseHomes(StateConfig(max_responses=4))
    homes.record("x1", "a", "x")
    homes.record("y1", "a", "y")
    homes.record("y2", "a", "y")
    homes.record("x2", "a", "x")
    homes.record("x3", "a", "x")  # x holds 3 of 5: its oldest, x1, goes
    assert await homes.home("x1", "x") is None
    assert [await homes.home(r, o) for r, o in (("y1", "y"), ("y2", "y"), ("x3", "x"))] == [
        "a",
        "a",
        "a",
    ]
    homes.record("y3", "a", "y")  # a tie (2 and 3 after y3): y holds more now, y1 goes
    assert await homes.home("y1", "y") is None
    assert len(homes) == 4


async def test_each_eviction_takes_from_a_tenant_holding_the_most() -> None:
    rng = random.Random(7)
    homes = ResponseHomes(StateConfig(max_responses=20))
    held: dict[str, str] = {}  # id -> owner, as the router should still know them
    for step in range(2000):
        owner = f"t{min(rng.randrange(12), rng.randrange(12))}"  # a few tenants make most
        rid = f"r{step}"
        counts = Counter(held.values())
        counts[owner] += 1
        homes.record(rid, "a", owner)
        held[rid] = owner
        if len(held) > 20:
            # (Each look-up below uses its note, so notes are used in `held`'s order.)
            gone = [r for r, o in held.items() if await homes.home(r, o) is None]
            assert len(gone) == 1
            # From a tenant that held the most, its least recently used note.
            loser = held[gone[0]]
            assert counts[loser] == max(counts.values())
            assert gone[0] == next(r for r, o in held.items() if o == loser)
            del held[gone[0]]
    assert len(homes) == 20
