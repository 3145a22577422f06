"""Response cache end to end: a real router in front of a real simulated region (subprocesses)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import openai
import pytest
import redis.asyncio as aioredis

from router.access.auth import hash_key
from tests.support import Proc, free_port, router_cmd, spawn, start_redis

MODEL = "sim-1"
KEYS = {"alpha": "sk-alpha-0123456789", "beta": "sk-beta-0123456789", "alpha2": "sk-alpha2-0123456"}
ADMIN = "admin-token-0123456789"


def router_config(sim: Proc, port: int, *, redis: Proc | None = None, extra: str = "") -> str:
    keys = "\n".join(
        f'[[auth.keys]]\nsha256 = "{hash_key(k)}"\ntenant = "{"alpha" if t == "alpha2" else t}"\n'
        for t, k in KEYS.items()
    )
    redis_line = f'redis_url = "redis://127.0.0.1:{redis.port}/0"\n' if redis else ""
    return f"""
[server]
listen = "127.0.0.1:{port}"

[auth]
admin_token_sha256 = "{hash_key(ADMIN)}"
{keys}

[[regions]]
name = "sim"
base_url = "{sim.url}/v1"
models = ["{MODEL}"]
endpoints = ["chat", "completions", "embeddings", "responses"]

[cache]
enabled = true
max_temperature = 1.0
allow_tools = true
{redis_line}{extra}
"""


def start_router(tmp: Path, sim: Proc, **kw: Any) -> Proc:
    port = free_port()
    cfg = tmp / f"router-{port}.toml"
    cfg.write_text(router_config(sim, port, **kw))
    return spawn(router_cmd("serve", "--config", str(cfg)), port, tmp / f"router-{port}.log")


def start_sim(tmp: Path, *options: str) -> Proc:
    port = free_port()
    args = router_cmd(
        "sim-region", "--port", str(port), "--models", MODEL, "--name", "sim", *options
    )
    return spawn(args, port, tmp / f"sim-{port}.log")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_sim(tmp_path_factory.mktemp("sim"))
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, sim: Proc) -> Iterator[Proc]:
    proc = start_router(tmp_path_factory.mktemp("router"), sim)
    yield proc
    proc.kill()


def client(proc: Proc, tenant: str = "alpha") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proc.url}/v1", api_key=KEYS[tenant], max_retries=0)


async def sim_requests(sim: Proc) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/sim/stats") as r:
        stats = await r.json()
    n: int = stats["requests"]
    return n


def origin_calls(sim: Proc) -> int:
    return asyncio.run(sim_requests(sim))


def chat(c: openai.OpenAI, text: str, **kw: Any) -> Any:
    kw.setdefault("temperature", 0)
    return c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text}], **kw
    )


def test_second_identical_request_is_a_hit_with_the_same_body(router: Proc, sim: Proc) -> None:
    c = client(router)
    before = origin_calls(sim)
    first = chat(c, "hit me once")
    second = chat(c, "hit me once")
    assert first.headers["x-cache"] == "MISS"
    assert second.headers["x-cache"] == "HIT"
    assert int(second.headers["Age"]) >= 0
    # The router's cache is per tenant; no shared cache in front of it may keep either answer.
    assert first.headers["Cache-Control"] == second.headers["Cache-Control"] == "no-store"
    assert second.parse().model_dump() == first.parse().model_dump()
    assert origin_calls(sim) == before + 1


def test_stream_hit_replays_the_same_chunks_with_usage(router: Proc, sim: Proc) -> None:
    c = client(router)

    def stream() -> tuple[str, list[dict[str, Any]]]:
        raw = chat(c, "stream me", stream=True, stream_options={"include_usage": True})
        assert raw.headers["Cache-Control"] == "no-store"
        return raw.headers["x-cache"], [chunk.model_dump() for chunk in raw.parse()]

    before = origin_calls(sim)
    first_state, first = stream()
    second_state, second = stream()
    assert (first_state, second_state) == ("MISS", "HIT")
    assert second == first
    assert first[-1]["usage"]["completion_tokens"] > 0
    assert origin_calls(sim) == before + 1
    # The same request without include_usage is a different stored form (no usage chunk).
    raw = chat(c, "stream me", stream=True)
    assert raw.headers["x-cache"] == "MISS"
    assert all(chunk.usage is None for chunk in raw.parse())
    # And the non-stream form is separate from both.
    assert chat(c, "stream me").headers["x-cache"] == "MISS"


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.5},
        {"max_tokens": 7},
        {"seed": 3},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    ],
    ids=["temperature", "max_tokens", "seed", "tools"],
)
def test_an_output_affecting_parameter_change_misses(router: Proc, change: dict[str, Any]) -> None:
    c = client(router)
    base = f"parameter {sorted(change)}"
    chat(c, base)
    assert chat(c, base).headers["x-cache"] == "HIT"
    assert chat(c, base, **change).headers["x-cache"] == "MISS"
    assert chat(c, base, **change).headers["x-cache"] == "HIT"


def test_a_message_change_misses(router: Proc) -> None:
    c = client(router)
    chat(c, "message one")
    assert chat(c, "message one").headers["x-cache"] == "HIT"
    assert chat(c, "message two").headers["x-cache"] == "MISS"
    assert chat(c, "message one ").headers["x-cache"] == "MISS"  # exact level: text counts


async def post_raw(proc: Proc, body: bytes, **headers: str) -> tuple[int, dict[str, str], bytes]:
    h = {"Authorization": f"Bearer {KEYS['alpha']}", "Content-Type": "application/json", **headers}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{proc.url}/v1/chat/completions", data=body, headers=h) as r,
    ):
        return r.status, dict(r.headers), await r.read()


def test_key_order_and_whitespace_do_not_change_the_key(router: Proc) -> None:
    a = b'{"model":"sim-1","temperature":0,"messages":[{"role":"user","content":"order"}]}'
    b = (
        b'{\n  "messages": [ { "content": "order", "role": "user" } ],\n'
        b'  "temperature": 0,\n  "model": "sim-1"\n}'
    )
    status_a, headers_a, body_a = asyncio.run(post_raw(router, a))
    status_b, headers_b, body_b = asyncio.run(post_raw(router, b))
    assert (status_a, status_b) == (200, 200)
    assert (headers_a["x-cache"], headers_b["x-cache"]) == ("MISS", "HIT")
    assert body_a == body_b


def schema_request(properties: str) -> bytes:
    """A temperature-0 Structured Outputs request whose schema lists `properties` (JSON text)."""
    return (
        b'{"model":"sim-1","temperature":0,"messages":[{"role":"user","content":"Solve 2+2."}],'
        b'"response_format":{"type":"json_schema","json_schema":{"name":"r","schema":'
        b'{"type":"object","properties":' + properties.encode() + b',"required":'
        b'["reasoning","answer"]}}}}'
    )


def test_member_order_inside_a_schema_changes_the_key(router: Proc) -> None:
    # The model generates the properties in this order: reasoning first, or the answer first.
    a = schema_request('{"reasoning":{"type":"string"},"answer":{"type":"string"}}')
    b = schema_request('{"answer":{"type":"string"},"reasoning":{"type":"string"}}')
    states = [asyncio.run(post_raw(router, raw))[1]["x-cache"] for raw in (a, b, a, b)]
    assert states == ["MISS", "MISS", "HIT", "HIT"]


def parts_request(*texts: str) -> bytes:
    content = [{"type": "text", "text": t} for t in texts]
    message = {"role": "user", "content": content}
    return msgspec.json.encode({"model": MODEL, "temperature": 0, "messages": [message]})


def test_normalized_text_parts_are_one_text(tmp_path: Path, sim: Proc) -> None:
    proc = start_router(tmp_path, sim, extra='level = "normalized"\n')
    try:
        states = [
            asyncio.run(post_raw(proc, parts_request(*texts)))[1]["x-cache"]
            for texts in (
                ("Fix this:\ndef f():", "  return 1"),
                # Indented code once the parts are joined: another question.
                ("Fix this:\ndef f():", "return 1"),
                ("Hello  world", "Line two\nLine three\nLine four"),
                ("Hello world", "Line two\nLine three\nLine four"),  # blank space folded
            )
        ]
        assert states == ["MISS", "MISS", "MISS", "HIT"]
    finally:
        proc.kill()


def test_cache_control_no_cache_and_no_store(router: Proc, sim: Proc) -> None:
    c = client(router)
    chat(c, "control")
    before = origin_calls(sim)
    fresh = chat(c, "control", extra_headers={"Cache-Control": "no-cache"})
    assert fresh.headers["x-cache"] == "BYPASS"
    assert origin_calls(sim) == before + 1
    unstored = chat(c, "control never stored", extra_headers={"Cache-Control": "no-store"})
    assert unstored.headers["x-cache"] == "MISS"
    assert chat(c, "control never stored").headers["x-cache"] == "MISS"


def test_uncacheable_requests_bypass(router: Proc) -> None:
    c = client(router)
    for _ in range(2):
        assert chat(c, "hot", temperature=1.5).headers["x-cache"] == "BYPASS"
        assert chat(c, "many", n=2).headers["x-cache"] == "BYPASS"
        assert chat(c, "unset", temperature=openai.NOT_GIVEN).headers["x-cache"] == "BYPASS"


def test_aborted_stream_is_never_stored(router: Proc) -> None:
    c = client(router)
    broken = chat(c, "die", stream=True, extra_headers={"x-sim-fail": "die-mid-stream"})
    assert broken.headers["x-cache"] == "MISS"
    with pytest.raises(openai.APIError):
        list(broken.parse())
    healthy = chat(c, "die", stream=True)
    assert healthy.headers["x-cache"] == "MISS"
    list(healthy.parse())
    assert chat(c, "die", stream=True).headers["x-cache"] == "HIT"


def test_upstream_error_is_not_stored(router: Proc) -> None:
    c = client(router)
    with pytest.raises(openai.APIStatusError):
        chat(c, "error", extra_headers={"x-sim-fail": "500"})
    assert chat(c, "error").headers["x-cache"] == "MISS"


async def concurrent(proc: Proc, body: bytes, n: int, **headers: str) -> list[tuple[str, bytes]]:
    h = {"Authorization": f"Bearer {KEYS['alpha']}", "Content-Type": "application/json", **headers}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as s:

        async def one() -> tuple[str, bytes]:
            async with s.post(f"{proc.url}/v1/chat/completions", data=body, headers=h) as r:
                assert r.status == 200
                return r.headers["x-cache"], await r.read()

        return await asyncio.gather(*(one() for _ in range(n)))


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_fifty_concurrent_identical_misses_send_one_upstream_request(
    router: Proc, sim: Proc, stream: bool
) -> None:
    body = msgspec.json.encode(
        {
            "model": MODEL,
            "temperature": 0,
            "stream": stream,
            "messages": [{"role": "user", "content": f"coalesce stream={stream}"}],
        }
    )
    before = origin_calls(sim)
    # A slow first token keeps the leader in flight while the other 49 arrive.
    results = asyncio.run(
        concurrent(router, body, 50, **{"x-sim-ttft-ms": "400", "x-sim-tokens-per-s": "200"})
    )
    assert origin_calls(sim) == before + 1
    assert sorted(state for state, _ in results).count("MISS") == 1
    assert len({payload for _, payload in results}) == 1
    if stream:
        assert results[0][1].endswith(b"data: [DONE]\n\n")


def test_tenants_never_see_each_others_entries(router: Proc) -> None:
    alpha, beta, alpha2 = client(router, "alpha"), client(router, "beta"), client(router, "alpha2")
    chat(alpha, "tenant secret")
    assert chat(alpha, "tenant secret").headers["x-cache"] == "HIT"
    assert chat(beta, "tenant secret").headers["x-cache"] == "MISS"
    # Two keys of one tenant share its namespace.
    assert chat(alpha2, "tenant secret").headers["x-cache"] == "HIT"


async def admin(proc: Proc, method: str, path: str, body: object = None) -> tuple[int, Any]:
    h = {"Authorization": f"Bearer {ADMIN}"}
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"{proc.url}{path}", json=body, headers=h) as r,
    ):
        return r.status, await r.json()


def test_admin_stats_and_purge(router: Proc) -> None:
    c = client(router)
    chat(c, "purge me")
    chat(client(router, "beta"), "purge me")
    status, stats = asyncio.run(admin(router, "GET", "/admin/cache/stats"))
    assert status == 200
    assert stats["entries"] >= 2
    assert stats["bytes"] > 0
    assert 0 < stats["hit_ratio"] < 1
    status, out = asyncio.run(admin(router, "POST", "/admin/cache/purge", {"tenant": "alpha"}))
    assert status == 200
    assert out["purged"] >= 1
    assert chat(c, "purge me").headers["x-cache"] == "MISS"
    assert chat(client(router, "beta"), "purge me").headers["x-cache"] == "HIT"
    status, out = asyncio.run(admin(router, "POST", "/admin/cache/purge", {"model": MODEL}))
    assert out["purged"] >= 2
    assert chat(client(router, "beta"), "purge me").headers["x-cache"] == "MISS"
    status, out = asyncio.run(admin(router, "POST", "/admin/cache/purge", {"bogus": 1}))
    assert status == 400
    assert out["error"]["type"] == "invalid_request_error"


@pytest.mark.redis
def test_redis_stopped_still_serving_and_two_routers_share_entries(
    tmp_path: Path, sim: Proc
) -> None:
    redis = start_redis(tmp_path)
    a = start_router(tmp_path, sim, redis=redis)
    b = start_router(tmp_path, sim, redis=redis)
    try:
        assert chat(client(a), "shared").headers["x-cache"] == "MISS"
        # The tier-2 write happens after the answer, so poll; no-store keeps b from storing a
        # copy of its own, which would turn a later probe into a tier-1 hit.
        for _ in range(50):
            got = chat(client(b), "shared", extra_headers={"Cache-Control": "no-store"})
            if got.headers["x-cache"] == "HIT":
                break
        assert got.headers["x-cache"] == "HIT"
        assert got.parse().model_dump() == chat(client(a), "shared").parse().model_dump()
        redis.kill()
        assert chat(client(a), "shared").headers["x-cache"] == "HIT"  # tier 1 still has it
        assert chat(client(a), "after outage").headers["x-cache"] == "MISS"
        assert chat(client(a), "after outage").headers["x-cache"] == "HIT"
        assert chat(client(b), "after outage").headers["x-cache"] == "MISS"
        warnings = a.output().count("redis tier unavailable")
        chat(client(a), "after outage again")
        chat(client(a), "after outage again 2")
        assert a.output().count("redis tier unavailable") == warnings == 1
    finally:
        a.kill()
        b.kill()
        redis.kill()


def _stored(redis: Proc) -> int:
    async def count() -> int:
        client = aioredis.Redis(port=redis.port)
        try:
            return int(await client.dbsize())
        finally:
            await client.aclose()

    return asyncio.run(count())


@pytest.mark.redis
def test_tier_two_races_the_region_and_never_delays_a_miss(tmp_path: Path, sim: Proc) -> None:
    redis = start_redis(tmp_path)
    # Tier 2 is never asked first here, and a lookup may take 30 s: it only ever runs beside
    # the region request.
    extra = "shared_lookup_first_ms = 0\nredis_timeout_s = 30\n"
    # b's region takes 20 s for a first byte (the same request as a's, so the same key).
    late = start_sim(tmp_path, "--ttft-ms", "20000")
    a = start_router(tmp_path, sim, redis=redis, extra=extra)
    b = start_router(tmp_path, late, redis=redis, extra=extra)
    c = start_router(tmp_path, sim, redis=redis, extra=extra)
    slow = {"Cache-Control": "no-store"}
    ca, cb, cc = client(a), client(b).with_options(timeout=10), client(c).with_options(timeout=10)
    try:
        assert chat(ca, "raced").headers["x-cache"] == "MISS"
        for _ in range(100):
            if _stored(redis):
                break
            time.sleep(0.05)
        before = origin_calls(late)
        # The region would take 20 s for its first byte; tier 2's answer wins and the region
        # request, sent at the same time, is cancelled.
        got = chat(cb, "raced", extra_headers=slow)
        assert got.headers["x-cache"] == "HIT"
        assert got.parse().model_dump() == chat(ca, "raced").parse().model_dump()
        assert origin_calls(late) == before + 1
        # A stream hit from tier 2 is an SSE stream like a live answer.
        live = chat(ca, "raced stream", stream=True)
        assert live.headers["x-cache"] == "MISS"
        expected = [chunk.model_dump() for chunk in live.parse()]
        for _ in range(100):
            if _stored(redis) >= 2:
                break
            time.sleep(0.05)
        streamed = chat(cb, "raced stream", stream=True, extra_headers=slow)
        assert streamed.headers["x-cache"] == "HIT"
        assert streamed.headers["content-type"].startswith("text/event-stream")
        chunks = [chunk.model_dump() for chunk in streamed.parse()]
        assert chunks == expected
        # Redis frozen mid-lookup: the miss is the region's answer, not a 30 s wait (c has
        # measured neither yet, so it races the two).
        redis.popen.send_signal(signal.SIGSTOP)
        try:
            got = chat(cc, "frozen redis miss")
            assert got.headers["x-cache"] == "MISS"
            assert got.parse().choices
        finally:
            redis.popen.send_signal(signal.SIGCONT)
    finally:
        ca.close()
        cb.close()
        cc.close()
        a.kill()
        b.kill()
        c.kill()
        late.kill()
        redis.kill()


@pytest.mark.redis
def test_a_near_redis_frozen_delays_an_asked_first_miss_at_most_the_bound(
    tmp_path: Path, sim: Proc
) -> None:
    redis = start_redis(tmp_path)
    # A local Redis is measured under 200 ms, so it is asked before the region; a lookup may
    # take 30 s. The docs promise an asked-first miss costs at most shared_lookup_first_ms.
    extra = "shared_lookup_first_ms = 200\nredis_timeout_s = 30\n"
    a = start_router(tmp_path, sim, redis=redis, extra=extra)
    ca = client(a).with_options(timeout=10)
    admin = {"Authorization": f"Bearer {ADMIN}"}

    def rtt_ms() -> float:
        async def get() -> float:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"{a.url}/admin/cache/stats", headers=admin) as r,
            ):
                ms: float = (await r.json())["redis"]["rtt_ms"]
                return ms

        return asyncio.run(get())

    try:
        assert chat(ca, "near 1").headers["x-cache"] == "MISS"  # raced: measures tier 2
        for _ in range(100):
            if _stored(redis):
                break
            time.sleep(0.05)
        assert rtt_ms() < 200
        redis.popen.send_signal(signal.SIGSTOP)
        try:
            for text in ("frozen 1", "frozen 2", "frozen 3"):
                got = chat(ca, text)  # was: each waited the full 30 s
                assert got.headers["x-cache"] == "MISS"
                assert got.parse().choices
            assert rtt_ms() >= 200  # the lookup that was not waited for counts as slow
        finally:
            redis.popen.send_signal(signal.SIGCONT)
    finally:
        ca.close()
        a.kill()
        redis.kill()


async def abort_leader_then_follow(proc: Proc, body: bytes) -> tuple[bytes, str]:
    """A leader stream whose client leaves after the first chunk, and a follower joined to it."""
    h = {
        "Authorization": f"Bearer {KEYS['alpha']}",
        "Content-Type": "application/json",
        "x-sim-tokens-per-s": "40",
    }
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as leader_s:
        leader = await leader_s.post(f"{proc.url}/v1/chat/completions", data=body, headers=h)
        assert leader.headers["x-cache"] == "MISS"
        await leader.content.readany()
        async with aiohttp.ClientSession(timeout=timeout) as follower_s:
            follower = await follower_s.post(
                f"{proc.url}/v1/chat/completions", data=body, headers=h
            )
            first = await follower.content.readany()
            leader.close()  # the leader's client goes away mid-stream
            rest = await follower.read()
            return first + rest, follower.headers["x-cache"]


def test_a_follower_gets_the_whole_answer_after_its_leader_left(router: Proc) -> None:
    body = msgspec.json.encode(
        {
            "model": MODEL,
            "temperature": 0,
            "stream": True,
            "messages": [{"role": "user", "content": "leader walks away"}],
        }
    )
    payload, state = asyncio.run(abort_leader_then_follow(router, body))
    assert state == "HIT"  # it joined the leader's flight
    # Issue 24 item 5: the exchange outlives the leader's client while a follower reads it.
    assert payload.endswith(b"data: [DONE]\n\n")
    assert b'"upstream_stream_error"' not in payload
    # ... and, whole, it was stored (for requests with the same headers).
    again = chat(
        client(router), "leader walks away", stream=True, extra_headers={"x-sim-tokens-per-s": "40"}
    )
    assert again.headers["x-cache"] == "HIT"


def test_embeddings_are_cached_and_identical(router: Proc) -> None:
    c = client(router)
    first = c.embeddings.with_raw_response.create(model=MODEL, input="embed me")
    second = c.embeddings.with_raw_response.create(model=MODEL, input="embed me")
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("MISS", "HIT")
    assert second.parse().data[0].embedding == first.parse().data[0].embedding


async def sim_last_headers(sim: Proc) -> dict[str, str]:
    async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/sim/stats") as r:
        headers: dict[str, str] = (await r.json())["last_headers"]
    return {k.lower(): v for k, v in headers.items()}


def test_a_miss_asks_the_region_for_identity_bytes(router: Proc, sim: Proc) -> None:
    body = b'{"model":"sim-1","temperature":0,"messages":[{"role":"user","content":"gzip?"}]}'
    status, headers, _ = asyncio.run(post_raw(router, body, **{"Accept-Encoding": "gzip, br"}))
    assert (status, headers["x-cache"]) == (200, "MISS")
    assert asyncio.run(sim_last_headers(sim))["accept-encoding"] == "identity"


def test_a_leader_whose_client_leaves_still_serves_its_followers(router: Proc, sim: Proc) -> None:
    """Issue 24 item 5: the upstream exchange lives as long as anyone still reads it."""
    body = msgspec.json.encode(
        {
            "model": MODEL,
            "temperature": 0,
            "stream": True,
            "messages": [{"role": "user", "content": "the leader hangs up"}],
        }
    )
    slow = {"x-sim-ttft-ms": "200", "x-sim-tokens-per-s": "100"}
    h = {"Authorization": f"Bearer {KEYS['alpha']}", "Content-Type": "application/json", **slow}

    async def scenario() -> tuple[bytes, str]:
        url = f"{router.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as leader_session, aiohttp.ClientSession() as s:
            leader = await leader_session.post(url, data=body, headers=h)
            await leader.content.readany()  # the leader streams...

            async def follow() -> tuple[bytes, str]:
                async with s.post(url, data=body, headers=h) as r:
                    return await r.read(), r.headers["x-cache"]

            follower = asyncio.create_task(follow())
            await asyncio.sleep(0.3)
            leader.close()  # ...and its client hangs up mid-answer
            return await follower

    before = origin_calls(sim)
    raw, state = asyncio.run(scenario())
    assert state == "HIT"
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b"upstream_stream_error" not in raw
    assert origin_calls(sim) == before + 1


def test_requests_whose_headers_differ_do_not_share_an_exchange(router: Proc, sim: Proc) -> None:
    """Issue 24 item 5: a follower never gets an answer another client's headers shaped."""
    body = msgspec.json.encode(
        {"model": MODEL, "temperature": 0, "messages": [{"role": "user", "content": "mine"}]}
    )
    base = {"Authorization": f"Bearer {KEYS['alpha']}", "Content-Type": "application/json"}

    async def pair() -> list[int]:
        url = f"{router.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as s:

            async def one(extra: dict[str, str]) -> int:
                async with s.post(url, data=body, headers={**base, **extra}) as r:
                    await r.read()
                    return r.status

            bad = {"x-sim-fail": "500", "x-sim-rtt-ms": "300"}
            return list(await asyncio.gather(one(bad), one({"x-sim-rtt-ms": "300"})))

    statuses = asyncio.run(pair())
    assert statuses[1] == 200


def streamed(c: openai.OpenAI, text: str, **kw: Any) -> tuple[str, str]:
    """A chat stream's x-cache and its text."""
    raw = chat(c, text, stream=True, **kw)
    content = "".join(k.choices[0].delta.content or "" for k in raw.parse() if k.choices)
    return raw.headers["x-cache"], content


def test_answer_shaping_headers_are_part_of_the_key(router: Proc) -> None:
    """A forwarded header may shape the answer: an entry never answers a request without it."""
    c = client(router)
    pad = {"x-sim-pad-bytes": "3"}  # the sim pads each streamed token
    padded, plain = streamed(c, "padded", extra_headers=pad), streamed(c, "padded")
    assert (padded[0], plain[0]) == ("MISS", "MISS")
    assert padded[1] != plain[1]
    assert streamed(c, "padded", extra_headers=pad) == ("HIT", padded[1])
    assert streamed(c, "padded") == ("HIT", plain[1])
    # Headers no region gets (or that never shape an answer) share the entry.
    forwarded = {"X-Forwarded-For": "10.1.2.3", "User-Agent": "another"}
    assert streamed(c, "padded", extra_headers=forwarded) == ("HIT", plain[1])
    # Nor do the tracing and correlation headers that load balancers, CDNs and APM agents add,
    # a new value on every request (a miss each time defeated the cache behind them).
    for n, name in enumerate(
        [
            "X-Amzn-Trace-Id",
            "sentry-trace",
            "baggage",
            "X-B3-TraceId",
            "b3",
            "x-datadog-trace-id",
            "X-Cloud-Trace-Context",
            "X-Correlation-Id",
            "uber-trace-id",
            "Via",
            "CF-Ray",
            "x-envoy-attempt-count",
        ]
    ):
        assert streamed(c, "padded", extra_headers={name: f"v{n}"}) == ("HIT", plain[1]), name


def test_fields_an_answer_shows_are_part_of_the_key(router: Proc) -> None:
    """Transport fields the fingerprint leaves out, yet the answer echoes (or that reshape a
    stream), split the key; the others do not."""
    c = client(router)
    assert streamed(c, "echoed")[0] == "MISS"
    assert streamed(c, "echoed", user="someone")[0] == "HIT"  # no chat answer shows it
    # Every API's answer shows the service tier it ran on.
    assert streamed(c, "echoed", service_tier="flex")[0] == "MISS"
    # vLLM's continuous_usage_stats puts usage in every chunk: another stream.
    usage_stats = {"stream_options": {"continuous_usage_stats": True}}
    assert streamed(c, "echoed", extra_body=usage_stats)[0] == "MISS"
    assert streamed(c, "echoed", extra_body=usage_stats)[0] == "HIT"

    def respond(**fields: Any) -> str:
        raw = c.responses.with_raw_response.create(
            model=MODEL, input="echoed", temperature=0, store=False, **fields
        )
        state: str = raw.headers["x-cache"]
        return state

    # A Responses object echoes metadata, user, prompt_cache_key...: never another request's.
    assert respond(metadata={"a": "1"}) == "MISS"
    assert respond(metadata={"a": "1"}) == "HIT"
    assert respond(metadata={"a": "2"}) == "MISS"
    assert respond(metadata={"a": "1"}, user="u") == "MISS"
    assert respond(metadata={"a": "1"}, prompt_cache_key="k") == "MISS"


@pytest.mark.redis
@pytest.mark.parametrize("purged_by", ["fast", MODEL])
def test_an_alias_and_its_model_share_entries_and_a_purge_by_either_name_drops_them(
    tmp_path: Path, sim: Proc, purged_by: str
) -> None:
    """An entry is its upstream model's (the key is the body the region gets): asked through an
    alias or by the model's own name, one entry in both tiers, and a purge by either name drops
    it (one by the model's name left an alias's entries to answer until their TTL)."""
    redis = start_redis(tmp_path)
    aliases = f'\n[models]\naliases = {{ fast = "{MODEL}" }}\n'
    a = start_router(tmp_path, sim, redis=redis, extra=aliases)
    b = start_router(tmp_path, sim, redis=redis, extra=aliases)
    try:

        def ask(model: str, router: Proc = a, *, store: bool = True) -> str:
            got = client(router).chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": "old weights"}],
                temperature=0,
                extra_headers=None if store else {"Cache-Control": "no-store"},
            )
            return str(got.headers["x-cache"])

        assert ask("fast") == "MISS"
        assert ask(MODEL) == "HIT"
        # In tier 2 as well: the other router finds it by the model's name (no-store: no copy
        # of its own in its tier 1).
        for _ in range(50):
            got = chat(client(b), "old weights", extra_headers={"Cache-Control": "no-store"})
            if got.headers["x-cache"] == "HIT":
                break
        assert got.headers["x-cache"] == "HIT"
        for router in (a, b):
            status, out = asyncio.run(
                admin(router, "POST", "/admin/cache/purge", {"model": purged_by})
            )
            assert status == 200, out
        # Looked up in both tiers of both routers, storing nothing (no-store) for the next look.
        assert ask("fast", store=False) == "MISS"
        assert ask(MODEL, b, store=False) == "MISS"
        assert ask("fast", b, store=False) == "MISS"
    finally:
        a.kill()
        b.kill()
        redis.kill()
