"""A cache hit streams back the bytes the live stream carried, fields besides `data:` included:
a real router in front of a real simulated region that sends a comment, `retry:`, `id:` and
`event:` lines on every API's streams (`router sim-region --sse-fields all`), from tier 1, to
coalesced followers and from tier 2 (a real redis-server) on another router."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import MODEL, RouterFactory, SimFactory, regions_toml, sim_stats
from tests.integration.test_metrics import call
from tests.support import Proc, start_redis

CACHE = """
[cache]
enabled = true
max_temperature = 1.0
"""
MESSAGES = [{"role": "user", "content": "replay every field"}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "messages": MESSAGES,
        "stream_options": {"include_usage": True},
    },
    "/v1/completions": {"prompt": "replay every field"},
    "/v1/responses": {"input": "replay every field", "store": False},
    "/v1/messages": {"messages": MESSAGES, "max_tokens": 8},
}


def ask(path: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "temperature": 0, "stream": True, **BODIES[path], **extra}


def streamed(
    router: Proc,
    path: str,
    body: dict[str, Any],
    outcome: str,
    headers: dict[str, str] | None = None,
) -> bytes:
    got = call(router.url + path, body, headers)
    assert got.status == 200, got.body
    assert got.headers["x-cache"] == outcome
    assert got.headers["content-type"] == "text/event-stream"
    return got.body


def carries_every_field(raw: bytes, eol: bytes) -> None:
    """The sim's fields reached the client: its comment, retry, ids and event names."""
    assert raw.startswith(b": sim region a" + eol + eol + b"retry: 3000" + eol + eol)
    assert b"id: 1" + eol in raw
    assert b"event: " in raw


@pytest.mark.parametrize("line_end", ["lf", "crlf"])
def test_a_hit_streams_back_the_bytes_the_live_stream_carried(
    sim_region: SimFactory, router_proc: RouterFactory, line_end: str
) -> None:
    a = sim_region("a", sse_fields="all", sse_line_end=line_end)
    router = router_proc(regions_toml(a, header=CACHE))
    eol = b"\r\n" if line_end == "crlf" else b"\n"
    for path in BODIES:
        live = streamed(router, path, ask(path), "MISS")
        carries_every_field(live, eol)
        assert streamed(router, path, ask(path), "HIT") == live, path
    assert sim_stats(a)["streams"] == len(BODIES)


async def _burst(router: Proc, path: str, body: dict[str, Any], n: int) -> list[tuple[str, bytes]]:
    timeout = aiohttp.ClientTimeout(total=30)
    # A slow first token keeps the leader in flight while the others join it.
    headers = {"x-sim-ttft-ms": "400", "x-sim-tokens-per-s": "100"}
    async with aiohttp.ClientSession(timeout=timeout) as s:

        async def one() -> tuple[str, bytes]:
            async with s.post(router.url + path, json=body, headers=headers) as r:
                assert r.status == 200
                return r.headers["x-cache"], await r.read()

        return await asyncio.gather(*(one() for _ in range(n)))


@pytest.mark.parametrize("path", list(BODIES))
def test_coalesced_followers_get_the_bytes_their_leader_got(
    sim_region: SimFactory, router_proc: RouterFactory, path: str
) -> None:
    a = sim_region("a", sse_fields="all")
    router = router_proc(regions_toml(a, header=CACHE))
    got = asyncio.run(_burst(router, path, ask(path), 5))
    assert sim_stats(a)["streams"] == 1
    assert sorted(outcome for outcome, _ in got) == ["HIT"] * 4 + ["MISS"]
    (leader,) = [raw for outcome, raw in got if outcome == "MISS"]
    carries_every_field(leader, b"\n")
    assert {raw for _, raw in got} == {leader}


@pytest.mark.redis
def test_a_tier_two_hit_on_another_router_streams_back_the_same_bytes(
    tmp_path: Any, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    redis = start_redis(tmp_path)
    try:
        # Slower to start answering than tier 2 (else the second router, having measured
        # that, would not ask tier 2 at all: cache.tiers.shared_may_win).
        a = sim_region("a", sse_fields="all", sse_line_end="crlf", ttft_ms=50)
        shared = CACHE + f'redis_url = "redis://127.0.0.1:{redis.port}/0"\n'
        first = router_proc(regions_toml(a, header=shared))
        second = router_proc(regions_toml(a, header=shared))
        # Plain, and with a header that shapes the answer (part of the key: the shared tier
        # read such a stream's key as a body's, and missed).
        for shaping in ({}, {"OpenAI-Organization": "org-1"}):
            for path in BODIES:
                live = streamed(first, path, ask(path), "MISS", shaping)
                carries_every_field(live, b"\r\n")
                # The tier-2 write is in the background: ask until it is there. no-store keeps
                # the second router from storing a copy of its own (a later ask would hit tier 1).
                for _ in range(50):
                    got = call(
                        second.url + path, ask(path), {"Cache-Control": "no-store", **shaping}
                    )
                    if got.headers["x-cache"] == "HIT":
                        break
                assert got.headers["x-cache"] == "HIT", (path, shaping)
                assert got.body == live, (path, shaping)
    finally:
        redis.kill()
