"""routing.affinity: which region holds each stored response, bounded."""

from __future__ import annotations

from router.routing.affinity import ResponseHomes


def test_homes_remember_the_most_recently_used() -> None:
    homes = ResponseHomes(capacity=2)
    homes.record("r1", "a")
    homes.record("r2", "b")
    assert homes.home("r1") == "a"  # r1 is now the most recently used
    homes.record("r3", "c")
    assert homes.home("r2") is None
    assert homes.home("r1") == "a"
    assert homes.home("r3") == "c"
    assert len(homes) == 2
