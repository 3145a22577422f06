"""[state] notes shared through a real redis-server: what another router wrote, or did not."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from router.config import StateConfig
from router.routing.affinity import ResponseHomes
from tests.support import Proc

pytestmark = pytest.mark.redis


@pytest.fixture
async def homes(redis_proc: Proc) -> AsyncIterator[ResponseHomes]:
    h = ResponseHomes(StateConfig(redis_url=f"redis://127.0.0.1:{redis_proc.port}/0"))
    life = h.lifetime(web.Application())
    await anext(life)
    yield h
    with pytest.raises(StopAsyncIteration):
        await anext(life)


async def test_a_note_from_another_router_is_found(homes: ResponseHomes) -> None:
    assert homes._redis is not None
    await homes._redis.set(homes._key("resp_1"), "region-b\ntenant")
    assert await homes.home("resp_1", "tenant") == "region-b"


async def test_a_note_that_is_not_utf8_is_not_known(homes: ResponseHomes) -> None:
    # Was a UnicodeDecodeError: a 500 on the follow-up and on GET /v1/responses/{id}.
    assert homes._redis is not None
    await homes._redis.set(homes._key("resp_bad"), b"\xff\xfe\x00garbage")
    assert await homes.home("resp_bad", "tenant") is None
