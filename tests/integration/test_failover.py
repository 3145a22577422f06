"""Failover with real processes: SIGKILL under load, slow region, retry budget, admin drain."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.sim import text
from tests.integration.conftest import (
    MODEL,
    RouterFactory,
    SimFactory,
    region_toml,
    sim_config,
    sim_stats,
    start_router,
    start_sim,
)
from tests.support import Proc, spawn

ADMIN = "admin-secret-token"
INTERVAL = 0.2
HEADER = f"""
[timeouts]
connect = 0.5
first_byte = 3.0
idle = 2.0
total = 20.0

[health]
interval_s = {INTERVAL}
timeout_s = 0.3
unhealthy_after = 2
healthy_after = 2
eject_after = 3
base_ejection_s = 1.0

[routing]
tolerance_ms = 5.0
max_attempts = 3

[cache]
enabled = false

[auth]
enabled = false
admin_token_sha256 = "{hashlib.sha256(ADMIN.encode()).hexdigest()}"
"""


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Request number {i} about regions."}]


@dataclass
class Three:
    """Regions a (nearest), b (+30 ms bias), c (+60 ms bias) behind one router."""

    a: Proc
    b: Proc
    c: Proc
    router: Proc
    tmp: Path

    def admin(self, method: str, path: str, token: str | None = ADMIN) -> tuple[int, Any]:
        import urllib.error
        import urllib.request

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        req = urllib.request.Request(
            self.router.url + path,
            method=method,
            headers=headers,
            data=b"" if method == "POST" else None,
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def region(self, name: str) -> dict[str, Any]:
        status, body = self.admin("GET", "/admin/health")
        assert status == 200, body
        found: dict[str, Any] = next(r for r in body["regions"] if r["name"] == name)
        return found


def start_three(tmp: Path, header: str = HEADER, **sim_flags: Any) -> Three:
    a = start_sim(tmp, "a", **sim_flags)
    b = start_sim(tmp, "b", **sim_flags)
    c = start_sim(tmp, "c", **sim_flags)
    config = header + region_toml(a) + region_toml(b, bias_ms=30.0) + region_toml(c, bias_ms=60.0)
    return Three(a, b, c, start_router(tmp, config), tmp)


@pytest.fixture
def fresh_three(tmp_path: Path) -> Any:
    """Three regions for one test (it may kill some)."""
    env = start_three(tmp_path, tokens_per_s=100)
    yield env
    for proc in (env.router, env.a, env.b, env.c):
        proc.kill()


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Three regions shared by the tests that leave them as they found them."""
    env = start_three(tmp_path_factory.mktemp("failover"), tokens_per_s=100)
    yield env
    for proc in (env.router, env.a, env.b, env.c):
        proc.kill()


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> float:
    """Poll until `check()`; returns the seconds it took."""
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout, "condition not reached in time"
        time.sleep(0.02)
    return time.monotonic() - began


@dataclass
class Outcomes:
    """What the clients saw."""

    ok: int = 0
    errors: list[str] = field(default_factory=list)
    midstream_errors: int = 0
    regions: Counter[str] = field(default_factory=Counter)
    failovers: int = 0


async def one_request(
    session: aiohttp.ClientSession, url: str, i: int, stream: bool, out: Outcomes
) -> None:
    body = {"model": MODEL, "messages": messages(i), "stream": stream}
    expected = text.full_chat_text(MODEL, messages(i))
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        raw = await resp.read()
        if resp.status != 200:
            out.errors.append(f"{resp.status}: {raw[:200]!r}")
            return
        out.regions[resp.headers["x-router-region"]] += 1
        out.failovers += int(resp.headers["x-router-failovers"])
    if not stream:
        got = json.loads(raw)["choices"][0]["message"]["content"]
        if got != expected:
            out.errors.append(f"non-stream text differs: {got!r}")
        else:
            out.ok += 1
        return
    pieces: list[str] = []
    done = error = False
    for line in raw.decode().splitlines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            error = True
            continue
        for choice in event.get("choices", []):
            pieces.append(choice.get("delta", {}).get("content") or "")
    streamed = "".join(pieces)
    if error and not done and expected.startswith(streamed):
        # Broke after tokens reached the client: a clean terminal error, never a fake [DONE].
        out.midstream_errors += 1
    elif done and not error and streamed == expected:
        out.ok += 1
    else:
        out.errors.append(f"bad stream: done={done} error={error} text={streamed!r}")


async def load(url: str, seconds: float, workers: int, out: Outcomes, start: int = 0) -> None:
    """`workers` closed-loop clients for `seconds`, alternating stream and non-stream."""
    stop = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def worker(w: int) -> None:
            n = 0
            while time.monotonic() < stop and n < 500:
                i = start + w * 1000 + n
                await one_request(session, url, i, stream=bool(n % 2), out=out)
                n += 1

        await asyncio.gather(*(worker(w) for w in range(workers)))


async def test_sigkill_nearest_under_load_then_restart(fresh_three: Three) -> None:
    three = fresh_three
    out = Outcomes()
    task = asyncio.create_task(load(three.router.url, 3.0, 6, out))
    await asyncio.sleep(1.0)
    assert three.region("a")["available"]
    three.a.kill()
    killed = time.monotonic()
    # Passive ejection usually takes it out first; the probes must flip it on their own too:
    # every INTERVAL, refused connections fail at once, so 2 intervals plus scheduling slack.
    took = await asyncio.to_thread(wait_until, lambda: not three.region("a")["healthy"])
    await task
    assert took < 2 * INTERVAL * 1.1 + 0.5, took
    assert out.errors == []
    assert out.ok > 20
    assert out.regions["a"] > 0
    assert out.regions["b"] > 0
    # Back by itself once restarted on the same port.
    restarted = spawn(three.a.args, three.a.port, three.tmp / "a-again.log")
    try:
        back = await asyncio.to_thread(wait_until, lambda: three.region("a")["available"])
        assert back < 5.0
        again = Outcomes()
        await load(three.router.url, 0.5, 2, again, start=90_000)
        assert again.errors == []
        assert again.regions["a"] > 0
    finally:
        restarted.kill()
    assert time.monotonic() - killed < 30


async def test_slow_region_loses_traffic_to_the_next(three: Three) -> None:
    first = Outcomes()
    await load(three.router.url, 0.5, 2, first)
    assert first.regions.most_common(1)[0][0] == "a"
    sim_config(three.a, rtt_ms=200.0)
    changed = time.monotonic()

    def mostly_b() -> bool:
        window = Outcomes()
        asyncio.run(load(three.router.url, 0.3, 2, window, start=50_000))
        return window.regions["b"] > 2 * window.regions["a"]

    try:
        took = await asyncio.to_thread(wait_until, mostly_b, 8.0)
        assert took < 5.0
        assert time.monotonic() - changed < 8.0
        assert three.region("a")["ewma_rtt_ms"] > 100
    finally:
        sim_config(three.a, rtt_ms=0.0)
        await asyncio.to_thread(wait_until, lambda: three.region("a")["ewma_rtt_ms"] < 20)


def test_retry_budget_bounds_attempts_when_every_region_fails(tmp_path: Path) -> None:
    header = HEADER.replace("max_attempts = 3", "max_attempts = 3\nretry_budget_min = 5")
    env = start_three(tmp_path, header, fail_mode="503")
    try:
        import urllib.error
        import urllib.request

        n = 60
        statuses = Counter()
        for i in range(n):
            body = json.dumps({"model": MODEL, "messages": messages(i)}).encode()
            req = urllib.request.Request(
                env.router.url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    statuses[resp.status] += 1
            except urllib.error.HTTPError as exc:
                statuses[exc.code] += 1
                exc.read()
        attempts = sum(sim_stats(p)["requests"] for p in (env.a, env.b, env.c))
        assert statuses == {503: n}
        # Without a budget: 3 attempts each (180). With it: n + min + 20 % of n.
        assert n < attempts <= n + 5 + int(0.2 * n)
    finally:
        for proc in (env.router, env.a, env.b, env.c):
            proc.kill()


async def test_failover_headers_and_admin_drain(three: Three) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "messages": messages(1)}
        headers = {"x-sim-fail": "503", "x-sim-only": "a"}
        async with session.post(
            three.router.url + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            assert resp.status == 200
            assert resp.headers["x-router-region"] == "b"
            assert resp.headers["x-router-attempts"] == "2"
            assert resp.headers["x-router-failovers"] == "1"
    assert three.admin("POST", "/admin/regions/a/drain", token=None)[0] == 401
    assert three.admin("POST", "/admin/regions/a/drain", token="wrong-token-value")[0] == 401
    status, body = three.admin("POST", "/admin/regions/nope/drain")
    assert status == 404
    assert body["error"]["code"] == "unknown_region"
    assert three.admin("POST", "/admin/regions/a/drain") == (
        200,
        {"region": "a", "admin": "drained", "in_flight": 0},
    )
    drained = Outcomes()
    task = asyncio.create_task(load(three.router.url, 0.5, 2, drained, start=70_000))
    # P2C compares admission's in-flight counts: under load the health view sees them.
    seen = 0
    while not task.done():
        seen = max(seen, (await asyncio.to_thread(three.region, "b"))["in_flight"])
        await asyncio.sleep(0.02)
    await task
    assert seen >= 1
    assert drained.errors == []
    assert drained.regions["a"] == 0
    assert three.region("a")["admin"] == "drained"
    assert three.admin("POST", "/admin/regions/a/enable")[0] == 200
    back = Outcomes()
    await load(three.router.url, 0.5, 2, back, start=80_000)
    assert back.regions["a"] > 0


async def test_a_drained_region_finishes_its_streams_in_flight(three: Three) -> None:
    body = {"model": MODEL, "messages": messages(3), "stream": True}
    slow = {"x-sim-tokens-per-s": "40"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(three.router.url + "/v1/chat/completions", json=body, headers=slow) as resp,
    ):
        assert resp.status == 200
        region = resp.headers["x-router-region"]
        first = await resp.content.readany()
        try:
            status, drained = three.admin("POST", f"/admin/regions/{region}/drain")
            assert status == 200
            assert drained["in_flight"] == 1  # this stream
            # New requests go elsewhere while the stream goes on where it was.
            async with session.post(
                three.router.url + "/v1/chat/completions", json={**body, "stream": False}
            ) as other:
                assert other.status == 200
                assert other.headers["x-router-region"] != region
            raw = first + await resp.read()
        finally:
            assert three.admin("POST", f"/admin/regions/{region}/enable")[0] == 200
    text, done, errors, ids = read_stream(raw)
    assert (done, errors, len(ids)) == (1, 0, 1)
    assert text


def stream_chunks(raw: bytes) -> tuple[list[dict[str, Any]], int, int]:
    """(chunks, [DONE] count, error events) of an SSE body, its lines ended by CR LF, LF or CR
    (str.splitlines ends them at each)."""
    chunks: list[dict[str, Any]] = []
    done = errors = 0
    for line in raw.decode().splitlines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done += 1
            continue
        event = json.loads(line[6:])
        if "error" in event:
            errors += 1
            continue
        chunks.append(event)
    return chunks, done, errors


def chunk_text(chunks: list[dict[str, Any]]) -> str:
    """The text of chat or completions chunks."""
    return "".join(
        (choice["delta"].get("content") if "delta" in choice else choice.get("text")) or ""
        for chunk in chunks
        for choice in chunk["choices"]
    )


def read_stream(raw: bytes) -> tuple[str, int, int, set[str]]:
    """(text, [DONE] count, error events, chunk ids) of an SSE body."""
    chunks, done, errors = stream_chunks(raw)
    return chunk_text(chunks), done, errors, {chunk["id"] for chunk in chunks}


async def broken_stream(
    url: str, i: int, after: int, prompt: str | None = None
) -> tuple[int, bytes]:
    """A stream that region a cuts after `after` tokens: chat, or completions of `prompt`."""
    body: dict[str, Any] = {"model": MODEL, "messages": messages(i), "stream": True}
    path = "/v1/chat/completions"
    if prompt is not None:
        body, path = {"model": MODEL, "prompt": prompt, "stream": True}, "/v1/completions"
    headers = {"x-sim-fail": "die-mid-stream", "x-sim-only": "a", "x-sim-after-tokens": str(after)}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.read()


async def test_midstream_break_ends_with_an_error_event_by_default(three: Three) -> None:
    status, raw = await broken_stream(three.router.url, 7, after=4)
    assert status == 200
    streamed, done, errors, _ = read_stream(raw)
    assert (done, errors) == (0, 1)
    assert text.full_chat_text(MODEL, messages(7)).startswith(streamed)
    assert streamed
    last = json.loads(raw.decode().strip().splitlines()[-1][6:])
    assert last["error"]["code"] == "upstream_stream_error"


def test_resume_mode_continues_on_the_next_region_exactly(tmp_path: Path) -> None:
    # Each break counts against a: five of them here, kept under eject_after and circuit_after
    # so that a stays first in line for the next one.
    header = HEADER.replace("eject_after = 3", "eject_after = 10").replace(
        "max_attempts = 3", 'max_attempts = 3\nmidstream = "resume"\ncircuit_after = 10'
    )
    env = start_three(tmp_path, header, tokens_per_s=200)
    try:
        for i, after in enumerate((1, 5, 12)):
            status, raw = asyncio.run(broken_stream(env.router.url, 100 + i, after))
            assert status == 200
            streamed, done, errors, ids = read_stream(raw)
            assert (done, errors) == (1, 0)
            assert streamed == text.full_chat_text(MODEL, messages(100 + i))
            # One stream to the client: the continuation carries the first stream's id.
            assert len(ids) == 1
        b = sim_stats(env.b)
        assert b["requests"] == 3
        assert '"role":"assistant"' in b["last_body"]
        assert env.region("a")["passive_failures"] == 3
        # A completions stream goes on from its prompt and the text so far.
        for i, after in enumerate((2, 7)):
            prompt = f"Story number {i}:"
            status, raw = asyncio.run(broken_stream(env.router.url, 0, after, prompt))
            assert status == 200
            streamed, done, errors, ids = read_stream(raw)
            assert (done, errors, len(ids)) == (1, 0, 1)
            assert streamed == "".join(text.completion_tokens(MODEL, prompt))
        sent = json.loads(sim_stats(env.b)["last_body"])
        # The prompt, then the text the client had.
        assert sent["prompt"].startswith("Story number 1:")
        assert len(sent["prompt"]) > len("Story number 1:")

        # SIGKILL under load: streams cut on a are finished by b, nobody sees an error.
        async def kill_under_load() -> Outcomes:
            out = Outcomes()
            task = asyncio.create_task(load(env.router.url, 2.0, 4, out, start=60_000))
            await asyncio.sleep(0.7)
            await asyncio.to_thread(env.a.kill)
            await task
            return out

        out = asyncio.run(kill_under_load())
        assert out.errors == []
        assert out.midstream_errors == 0
        assert out.regions["a"] > 0
        assert out.regions["b"] > 0
    finally:
        for proc in (env.router, env.a, env.b, env.c):
            proc.kill()


def test_hedging_then_routing_hot_reload(tmp_path: Path) -> None:
    header = HEADER.replace(
        "max_attempts = 3",
        'max_attempts = 3\nhedge_endpoints = ["/v1/chat/completions"]\nhedge_delay_ms = 100.0',
    )
    env = start_three(tmp_path, header)
    try:
        sim_config(env.a, ttft_ms=3000.0)
        body = {"model": MODEL, "messages": messages(5), "stream": True}

        async def call() -> tuple[float, int, dict[str, str], bytes]:
            began = time.monotonic()
            async with (
                aiohttp.ClientSession() as session,
                session.post(env.router.url + "/v1/chat/completions", json=body) as resp,
            ):
                raw = await resp.read()
                return time.monotonic() - began, resp.status, dict(resp.headers), raw

        took, status, headers, raw = asyncio.run(call())
        assert status == 200
        assert headers["x-router-region"] == "b"
        assert headers["x-router-attempts"] == "2"
        assert headers["x-router-hedged"] == "b"
        assert headers["x-router-failovers"] == "0"
        streamed, done, errors, _ = read_stream(raw)
        assert (streamed, done, errors) == (text.full_chat_text(MODEL, messages(5)), 1, 0)
        assert took < 2.5  # a alone would take over 3 s
        # The loser was cancelled: the slow region saw its client go away.
        wait_until(lambda: sim_stats(env.a)["cancelled"] == 1, 5.0)
        assert sim_stats(env.b)["completed"] == 1

        # [routing] hot reload: switch to resume mode, and a broken stream now completes.
        sim_config(env.a, ttft_ms=0.0)
        status, raw = asyncio.run(broken_stream(env.router.url, 6, after=3))
        assert read_stream(raw)[1:3] == (0, 1)
        path = Path(env.router.args[-1])
        path.write_text(path.read_text().replace("[routing]", '[routing]\nmidstream = "resume"'))
        status, body = env.admin("POST", "/admin/reload")
        assert status == 200, body
        status, raw = asyncio.run(broken_stream(env.router.url, 6, after=3))
        streamed, done, errors, _ = read_stream(raw)
        assert (streamed, done, errors) == (text.full_chat_text(MODEL, messages(6)), 1, 0)
    finally:
        for proc in (env.router, env.a, env.b, env.c):
            proc.kill()


async def test_a_burst_in_flight_when_the_nearest_region_dies_is_not_turned_into_502s(
    fresh_three: Three,
) -> None:
    """Issue 23: 40 requests in flight at the nearest region when it is SIGKILLed, after only a
    handful in the previous seconds: every one is answered by another region (a broken
    connection retried elsewhere spends no retry budget; a refused one neither)."""
    three = fresh_three
    url = three.router.url + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(i: int) -> int:
            body = {"model": MODEL, "messages": messages(200_000 + i)}
            # Slow (every region: well under [timeouts] first_byte): the burst still waits at a
            # when it dies.
            headers = {"x-sim-ttft-ms": "1500"}
            async with session.post(url, json=body, headers=headers) as resp:
                await resp.read()
                return resp.status

        burst = [asyncio.create_task(one(i)) for i in range(40)]
        deadline = time.monotonic() + 1.2  # under the region's 1.5 s TTFT
        while (await asyncio.to_thread(sim_stats, three.a))["active"] < 20:
            assert time.monotonic() < deadline, "the burst never reached the region"
            await asyncio.sleep(0.05)
        three.a.kill()
        statuses = Counter(await asyncio.gather(*burst))
    assert statuses == {200: 40}


def test_a_region_shedding_load_with_retry_after_is_left_alone_that_long(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    """a answers 429 with Retry-After: 1 (the sim's) while its health probe is fine; b serves.
    Each request fails over at once, but a is asked again only after its Retry-After."""
    a, b = sim_region("a"), sim_region("b")
    config = "[auth]\nenabled = false\n" + region_toml(a) + region_toml(b, bias_ms=100)
    router = router_proc(config)
    url = router.url + "/v1/chat/completions"
    body = json.dumps({"model": MODEL, "messages": messages(1)}).encode()
    shed = {"Content-Type": "application/json", "x-sim-fail": "429", "x-sim-only": "a"}
    began = time.monotonic()
    answers = [_post(url, body, shed) for _ in range(30)]
    elapsed = time.monotonic() - began
    assert [status for status, _ in answers] == [200] * 30
    assert {headers["x-router-region"] for _, headers in answers} == {"b"}
    # Once per Retry-After at most (and the first), not once per request.
    assert sim_stats(a)["requests"] <= 1 + int(elapsed)


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}


def _ask(url: str, content: object) -> tuple[int, dict[str, str], dict[str, Any]]:
    """POST one non-stream chat request; (status, headers, JSON body)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 3}
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def test_an_input_a_region_cannot_take_goes_elsewhere_and_counts_against_no_one(
    tmp_path: Path,
) -> None:
    """Issue: llama-server answers an image to a text model with a 500; the router held it
    against the region (circuits opened), spent the retry budget on it, and then could not fail
    a real outage over."""
    env = start_three(tmp_path, kind="llama-server")
    try:
        sim_config(env.c, multimodal=True)  # only c has a vision model
        image = [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ]
        for _ in range(12):
            status, headers, _ = _ask(env.router.url, image)
            assert (status, headers["x-router-region"]) == (200, "c")
        assert env.region("a")["passive_failures"] == env.region("b")["passive_failures"] == 0
        # a is still the nearest for text, and a real outage there still fails over.
        status, headers, _ = _ask(env.router.url, "hello")
        assert (status, headers["x-router-region"]) == (200, "a")
        sim_config(env.a, fail_mode="hang")
        status, headers, _ = _ask(env.router.url, "hello")
        assert (status, headers["x-router-region"]) == (200, "b")
        sim_config(env.a, fail_mode="none")
        # No region can take it: one clear 400 (not the region's 500, which SDKs retry).
        sim_config(env.c, multimodal=False)
        status, headers, answer = _ask(env.router.url, image)
        assert status == 400
        assert answer["error"]["code"] == "unsupported_by_region"
        assert answer["error"]["type"] == "invalid_request_error"
        assert "image input is not supported" in answer["error"]["message"]
    finally:
        for proc in (env.router, env.a, env.b, env.c):
            proc.kill()


def test_a_region_without_the_model_fails_over_and_opens_only_that_circuit(
    tmp_path: Path,
) -> None:
    """Issue: a region whose config drifted (it no longer serves a model the router's config
    says it does) answered vLLM's 404, and the client got that 404 although b and c serve the
    model. It is a failed attempt now: the next region answers, the (region, model) circuit
    counts it, the region's health does not."""
    header = HEADER.replace(
        "max_attempts = 3",
        "max_attempts = 3\ncircuit_after = 3\ncircuit_base_s = 30.0\ncircuit_max_s = 30.0",
    )
    env = start_three(tmp_path, header)
    url = env.router.url
    try:
        sim_config(env.a, unserved=[MODEL])
        for i in range(3):
            status, headers, _ = _ask(url, f"drift {i}")
            assert (status, headers["x-router-region"]) == (200, "b")
            assert headers["x-router-failovers"] == "1"
        # Never the region's health: no passive failure, no ejection, still available.
        region = env.region("a")
        assert (region["passive_failures"], region["ejections"]) == (0, 0)
        assert region["available"]
        assert f"region a: circuit for model {MODEL} open" in env.router.output()
        # Its circuit for the model open, a goes last: b first, no failover to pay.
        status, headers, _ = _ask(url, "drift 3")
        assert (status, headers["x-router-region"], headers["x-router-attempts"]) == (200, "b", "1")
        assert sim_stats(env.a)["requests"] == 3
        # No region has it: a 404 in OpenAI's shape (the last region's), each region once.
        sim_config(env.b, unserved=[MODEL])
        sim_config(env.c, unserved=[MODEL])
        status, headers, answer = _ask(url, "drift 4")
        assert (status, headers["x-router-attempts"]) == (404, "3")
        assert answer == {
            "error": {
                "message": f"The model `{MODEL}` does not exist.",
                "type": "NotFoundError",
                "param": None,
                "code": 404,
            }
        }
    finally:
        for proc in (env.router, env.a, env.b, env.c):
            proc.kill()


def test_a_region_started_without_the_model_fails_over(tmp_path: Path) -> None:
    """The same drift from the start (`router sim-region --unserved`), on a stream."""
    a = start_sim(tmp_path, "a", unserved=MODEL)
    b = start_sim(tmp_path, "b")
    router = start_router(tmp_path, HEADER + region_toml(a) + region_toml(b, bias_ms=30.0))
    try:
        headers, raw = asyncio.run(_stream(router.url, 1, cut_at_a=False))
        assert (headers["x-router-region"], headers["x-router-failovers"]) == ("b", "1")
        streamed, done, errors, _ = read_stream(raw)
        assert (streamed, done, errors) == (text.full_chat_text(MODEL, messages(1)), 1, 0)
    finally:
        for proc in (router, a, b):
            proc.kill()


async def _stream(url: str, i: int, *, cut_at_a: bool) -> tuple[dict[str, str], bytes]:
    """A chat stream (`cut_at_a`: region a cuts it right after its first token): the answer's
    headers and body."""
    body = {"model": MODEL, "messages": messages(i), "stream": True}
    headers = {}
    if cut_at_a:
        headers = {"x-sim-fail": "die-mid-stream", "x-sim-only": "a", "x-sim-after-tokens": "1"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        return dict(resp.headers), await resp.read()


def test_a_region_cutting_every_stream_after_its_first_token_is_ejected(tmp_path: Path) -> None:
    """Issue: a stream counted as a success at its first byte, then its break as a failure, so
    a region cutting every stream never had two failures in a row: never ejected, never out of
    its circuit, every stream ended in an error event. A stream's success now comes at its
    end: breaks build up; a stream that went through resets the count."""
    header = HEADER.replace("base_ejection_s = 1.0", "base_ejection_s = 30.0").replace(
        "max_attempts = 3", "max_attempts = 3\ncircuit_after = 50"
    )
    env = start_three(tmp_path, header)
    url = env.router.url
    try:
        headers, raw = asyncio.run(_stream(url, 1, cut_at_a=True))
        assert (headers["x-router-region"], read_stream(raw)[1:3]) == ("a", (0, 1))
        # One break is one failure: a region with eject_after = 3 stays in.
        assert (env.region("a")["passive_failures"], env.region("a")["ejections"]) == (1, 0)
        # A stream that went through ends the run of failures, and its TTFT counts.
        headers, raw = asyncio.run(_stream(url, 2, cut_at_a=False))
        assert (headers["x-router-region"], read_stream(raw)[1:3]) == ("a", (1, 0))
        wait_until(lambda: env.region("a")["passive_failures"] == 0)
        assert env.region("a")["ewma_ttft_ms"] is not None
        for i in (3, 4):
            headers, raw = asyncio.run(_stream(url, i, cut_at_a=True))
            assert (headers["x-router-region"], read_stream(raw)[1:3]) == ("a", (0, 1))
        assert (env.region("a")["passive_failures"], env.region("a")["ejections"]) == (2, 0)
        # The third break in a row ejects it: the next stream goes to b, whole.
        headers, raw = asyncio.run(_stream(url, 5, cut_at_a=True))
        assert read_stream(raw)[1:3] == (0, 1)
        assert env.region("a")["ejections"] == 1
        headers, raw = asyncio.run(_stream(url, 6, cut_at_a=True))
        assert (headers["x-router-region"], headers["x-router-attempts"]) == ("b", "1")
        assert read_stream(raw)[1:3] == (1, 0)
    finally:
        for proc in (env.router, env.a, env.b, env.c):
            proc.kill()


def test_resumed_breaks_build_up_against_the_region_that_cuts_its_streams(
    tmp_path: Path,
) -> None:
    """midstream = "resume": every stream breaks at a and is finished by b, whole. Each break
    counts against a (its health and its circuit for the model), so after circuit_after of
    them a's circuit opens and streams go to b first, without a break to pay."""
    header = HEADER.replace("eject_after = 3", "eject_after = 50").replace(
        "max_attempts = 3",
        'max_attempts = 3\nmidstream = "resume"\ncircuit_after = 3\n'
        "circuit_base_s = 30.0\ncircuit_max_s = 30.0",
    )
    env = start_three(tmp_path, header)
    url = env.router.url
    try:
        for i in range(3):
            headers, raw = asyncio.run(_stream(url, 10 + i, cut_at_a=True))
            streamed, done, errors, _ = read_stream(raw)
            assert (streamed, done, errors) == (text.full_chat_text(MODEL, messages(10 + i)), 1, 0)
            # Its head went out from a, before the break.
            assert headers["x-router-region"] == "a"
        assert sim_stats(env.b)["requests"] == 3
        assert env.region("a")["passive_failures"] == 3
        headers, raw = asyncio.run(_stream(url, 13, cut_at_a=True))
        assert (headers["x-router-region"], headers["x-router-attempts"]) == ("b", "1")
        assert read_stream(raw)[1:3] == (1, 0)
        assert sim_stats(env.a)["requests"] == 3
    finally:
        for proc in (env.router, env.a, env.b, env.c):
            proc.kill()


def test_a_stream_past_the_total_deadline_is_not_held_against_its_region(tmp_path: Path) -> None:
    """Review finding: the exchange's total deadline (the router's own bound, reached by a
    long stream or a client too slow to read it) was a break of the region's stream: three in
    a row ejected a healthy region and opened its circuit."""
    header = HEADER.replace("total = 20.0", "total = 1.0").replace(
        "max_attempts = 3", "max_attempts = 3\ncircuit_after = 3"
    )
    env = start_three(tmp_path, header, tokens_per_s=10)
    url = env.router.url
    try:
        for i in range(4):
            headers, raw = asyncio.run(_stream(url, i, cut_at_a=False))
            assert headers["x-router-region"] == "a"
            _, done, errors, _ = read_stream(raw)
            assert (done, errors) == (0, 1)
            assert b"longer than the router allows one exchange" in raw
        region = env.region("a")
        assert (region["passive_failures"], region["ejections"]) == (0, 0)
        assert "circuit" not in env.router.output()
    finally:
        for proc in (env.router, env.a, env.b, env.c):
            proc.kill()


@pytest.mark.parametrize("stream", [False, True])
def test_a_fallback_model_gets_its_own_attempts_after_the_first_model_used_all_of_its(
    sim_region: SimFactory, router_proc: RouterFactory, stream: bool
) -> None:
    # "big" on a and b, both failing; "small" on c. max_attempts = 2: big's two regions use
    # both of its attempts, and small must still be tried, with its own.
    a, b = sim_region("a", models="big"), sim_region("b", models="big")
    c = sim_region("c", models="small")
    header = '[routing]\nmax_attempts = 2\n[models]\nfallbacks = { big = ["small"] }\n'
    router = router_proc(
        header
        + "[auth]\nenabled = false\n"
        + region_toml(a, models=("big",))
        + region_toml(b, models=("big",), bias_ms=50)
        + region_toml(c, models=("small",))
    )
    body = {"model": "big", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    request = urllib.request.Request(
        router.url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "x-sim-fail": "500", "x-sim-only": "a,b"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["x-router-fallback-model"] == "small"
        assert resp.headers["x-router-region"] == "c"
        answer = resp.read()
    assert (b"[DONE]" in answer) if stream else json.loads(answer)["model"] == "small"
    assert sim_stats(a)["requests"] == sim_stats(b)["requests"] == 1
    assert sim_stats(c)["requests"] == 1
