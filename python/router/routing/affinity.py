"""Where state lives: the region holding each stored Responses API response.

A response created with `store` (the Responses API's default), in background mode or in a
conversation exists only on the region that made it, with its output items; a request
continuing it (`previous_response_id`), referring to its items (`item_reference`) or reading it
(`GET /v1/responses/{id}`) must go there and nowhere else. The router notes the region of each
such response it relays and of its output items, for the tenant that made it
(bounded: past the bound, the least recently used note of the tenant holding the most goes, so
no tenant's notes push out another's smaller share), with workers in a table the machine's
workers share (routing.shared_pins), and, with `[state] redis_url`, shares the notes with the
other routers of the deployment: written in the background, read only when a follow-up's
ids are not in memory (one Redis round trip for all of a request's ids, bounded by
`redis_timeout_s`; a value that is not text is "not known"). No answer from Redis is a 503,
never "not known": a request whose state may be another tenant's is never sent to a region
unchecked.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator

from aiohttp import web

from router.config import StateConfig
from router.errors import StateNotFound, Unavailable
from router.net.redis_client import OUTAGE, Client, hash_tagged, open_redis
from router.routing.shared_pins import SharedPins

log = logging.getLogger("router")

# Notes written to Redis that have not finished yet (kept referenced until they do).
_WRITES: set[asyncio.Task[None]] = set()
# An outage is logged once per this many failed calls.
_LOG_EVERY = 1000


def _note(raw: object) -> tuple[str, str] | None:
    """A note as Redis holds it, `region\nowner`; None for anything else (not a router's)."""
    if not isinstance(raw, bytes):
        return None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    region, _, owner = text.partition("\n")
    return region, owner


def _foreign(response_id: str) -> StateNotFound:
    # Worded as for an unknown id: another tenant's response does not exist for this one.
    return StateNotFound(response_id)


class ResponseHomes:
    """Response id -> the region that holds it and the tenant it belongs to
    (core.stages.StateHomes). Another tenant's response is not found."""

    __slots__ = (
        "_by_owner",
        "_failures",
        "_holding",
        "_homes",
        "_most",
        "_redis",
        "capacity",
        "config",
        "shared",
    )

    def __init__(self, config: StateConfig | None = None, shared: SharedPins | None = None) -> None:
        self.config = config or StateConfig()
        # With workers: the machine's table, so a sibling's notes are found too.
        self.shared = shared
        self.capacity = self.config.max_responses
        # id -> (region, owner), and each owner's ids, least recently used first.
        self._homes: dict[str, tuple[str, str]] = {}
        self._by_owner: dict[str, OrderedDict[str, None]] = {}
        # Owners by how many notes they hold, and the most any holds: the heaviest in O(1).
        self._holding: dict[int, dict[str, None]] = {}
        self._most = 0
        self._redis: Client | None = None
        self._failures = 0

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """A cleanup_ctx: the Redis client (with [state] redis_url) lives as long as the app."""
        config = self.config
        if config.redis_url is not None:
            self._redis = open_redis(
                config.redis_url,
                timeout_s=config.redis_timeout_s,
                max_connections=config.redis_max_connections,
                cluster=config.redis_cluster,
            )
        yield
        redis, self._redis = self._redis, None
        if _WRITES:
            await asyncio.gather(*_WRITES, return_exceptions=True)
        if redis is not None:
            await redis.aclose()

    def record(self, response_id: str, region: str, owner: str) -> None:
        """`region` holds the response `response_id`, made by tenant `owner`."""
        self._remember(response_id, region, owner)
        if self.shared is not None:
            self.shared.record(response_id, region, owner)
        if self._redis is not None:
            task = asyncio.get_running_loop().create_task(
                self._write(self._redis, response_id, f"{region}\n{owner}")
            )
            _WRITES.add(task)
            task.add_done_callback(_WRITES.discard)

    async def home(self, response_id: str, owner: str) -> str | None:
        """The region holding `response_id`, if it was made through this router (or, sharing,
        through any); NotFound when another tenant made it; Unavailable when Redis, which may
        know, did not answer."""
        (region,) = await self.homes((response_id,), owner)
        return region

    async def homes(self, ids: tuple[str, ...], owner: str) -> list[str | None]:
        """`home` of each of `ids`, those not in memory read from Redis in one round trip."""
        found = [self._local(i, owner) for i in ids]
        missing = [n for n, f in enumerate(found) if f is None]
        if missing and self._redis is not None:
            read = await self._read(self._redis, [ids[n] for n in missing])
            for n, note in zip(missing, read, strict=True):
                if note is not None:
                    self._remember(ids[n], *note)
                    found[n] = note
        regions: list[str | None] = []
        for response_id, note in zip(ids, found, strict=True):
            if note is None:
                regions.append(None)
                continue
            if note[1] != owner:
                raise _foreign(response_id)
            self._by_owner[owner].move_to_end(response_id)
            regions.append(note[0])
        return regions

    def _local(self, response_id: str, owner: str) -> tuple[str, str] | None:
        """The note of `response_id` in memory or the machine's table, if any."""
        found = self._homes.get(response_id)
        if found is None and self.shared is not None:
            noted = self.shared.home(response_id, owner)
            if noted is not None:
                region, own = noted
                if not own:
                    raise _foreign(response_id)
                found = (region, owner)
                self._remember(response_id, region, owner)
        return found

    def __len__(self) -> int:
        return len(self._homes)

    def _remember(self, response_id: str, region: str, owner: str) -> None:
        homes, by_owner = self._homes, self._by_owner
        before = homes.get(response_id)
        if before is not None and before[1] != owner:
            self._forget(response_id, before[1])
        homes[response_id] = (region, owner)
        ids = by_owner.get(owner)
        if ids is None:
            ids = by_owner[owner] = OrderedDict()
        if response_id in ids:
            ids.move_to_end(response_id)
        else:
            ids[response_id] = None
            self._counted(owner, len(ids) - 1, len(ids))
        while len(homes) > self.capacity:
            # The tenant holding the most gives up its least recently used note.
            heaviest = next(iter(self._holding[self._most]))
            oldest = next(iter(by_owner[heaviest]))
            self._forget(oldest, heaviest)

    def _forget(self, response_id: str, owner: str) -> None:
        del self._homes[response_id]
        ids = self._by_owner[owner]
        del ids[response_id]
        self._counted(owner, len(ids) + 1, len(ids))
        if not ids:
            del self._by_owner[owner]

    def _counted(self, owner: str, was: int, now: int) -> None:
        """`owner` went from holding `was` notes to `now` (one more or one fewer)."""
        holding = self._holding
        if was:
            group = holding[was]
            del group[owner]
            if not group:
                del holding[was]
        if now:
            holding.setdefault(now, {})[owner] = None
        if now > self._most:
            self._most = now
        elif was == self._most and was not in holding:
            self._most = now  # counts move by one: the owner that moved is the heaviest now

    def _key(self, response_id: str) -> str:
        return hash_tagged(self.config.redis_prefix, response_id)

    async def _write(self, redis: Client, response_id: str, value: str) -> None:
        try:
            await redis.set(self._key(response_id), value, ex=int(self.config.ttl_s))
        except OUTAGE as exc:
            self._failed("write", exc)

    async def _read(self, redis: Client, ids: list[str]) -> list[tuple[str, str] | None]:
        """The notes of `ids` (None: not noted), in one round trip; Unavailable when Redis
        does not answer in time."""
        try:
            async with asyncio.timeout(self.config.redis_timeout_s):
                if len(ids) == 1:
                    raws = [await redis.get(self._key(ids[0]))]
                else:
                    pipe = redis.pipeline(transaction=False)
                    for response_id in ids:
                        pipe.get(self._key(response_id))
                    raws = await pipe.execute()
        except OUTAGE as exc:
            self._failed("read", exc)
            raise Unavailable(
                "Where this request's stored state lives cannot be looked up now ([state] "
                "Redis did not answer); retry shortly.",
                code="state_unavailable",
                headers={"Retry-After": "1"},
            ) from None
        return [_note(raw) for raw in raws]

    def _failed(self, what: str, exc: BaseException) -> None:
        self._failures += 1
        if self._failures % _LOG_EVERY == 1:
            log.warning(
                "[state] Redis did not answer a %s (%d failed so far): %r",
                what,
                self._failures,
                exc,
            )
