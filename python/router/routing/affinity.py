"""Where state lives: the region holding each stored Responses API response.

A response created with `store` (the Responses API's default), in background mode or in a
conversation exists only on the region that made it; a request continuing it
(`previous_response_id`) must go there and nowhere else. The router notes the region of each
such response it relays (bounded, least recently used first out) and pins the follow-ups.
"""

from __future__ import annotations

from collections import OrderedDict

# Responses remembered; at ~150 bytes each, 100 000 are ~15 MB.
DEFAULT_CAPACITY = 100_000


class ResponseHomes:
    """Response id -> the region that holds it and the tenant it belongs to
    (core.stages.StateHomes). Another tenant's response is not found."""

    __slots__ = ("_homes", "capacity")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._homes: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def record(self, response_id: str, region: str, owner: str) -> None:
        """`region` holds the response `response_id`, made by tenant `owner`."""
        homes = self._homes
        homes[response_id] = (region, owner)
        homes.move_to_end(response_id)
        while len(homes) > self.capacity:
            homes.popitem(last=False)

    def home(self, response_id: str, owner: str) -> str | None:
        """The region holding `response_id`, if this router saw `owner` create it."""
        found = self._homes.get(response_id)
        if found is None or found[1] != owner:
            return None
        self._homes.move_to_end(response_id)
        return found[0]

    def __len__(self) -> int:
        return len(self._homes)
