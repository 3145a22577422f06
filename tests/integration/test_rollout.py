"""Rollout end to end: a real router in front of two sim regions, one per model version."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
import pytest

from tests.integration.conftest import start_sim
from tests.integration.test_metrics import call
from tests.support import Proc, free_port, router_cmd, spawn

ADMIN_TOKEN = "admin-secret-token-for-tests"
ADMIN_SHA256 = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
VERSION = "x-router-model-version"


def config_text(port: int, a: int, b: int, w1: float, w2: float, extra: str = "") -> str:
    """Region a serves v1 (llama-v1), region b serves v2 (llama-v2)."""
    return general_config(port, {"a": a, "b": b}, {"v1": w1, "v2": w2}, extra)


def general_config(
    port: int, regions: dict[str, int], weights: dict[str, float], extra: str = ""
) -> str:
    """Region a, b, c serves llama-v1, v2, v3; version vN is model llama-vN."""
    region_tables = "".join(
        f'[[regions]]\nname = "{name}"\nbase_url = "http://127.0.0.1:{rport}"\n'
        f'models = ["llama-v{"abc".index(name) + 1}"]\n\n'
        for name, rport in regions.items()
    )
    deployments = "".join(
        f'  {{ version = "{v}", model = "llama-{v}", weight = {w} }},\n' for v, w in weights.items()
    )
    return f"""
[server]
listen = "127.0.0.1:{port}"

[auth]
enabled = false
admin_token_sha256 = "{ADMIN_SHA256}"

{region_tables}
[rollout.canary]
auto_rollback = true
min_samples = 20
check_interval_s = 0.2
max_error_rate_delta = 0.2

[rollout.models.chat-default]
stable = "v1"
deployments = [
{deployments}]
{extra}
"""


@dataclass
class Stack:
    """Two sim regions and the router in front, with the router's config file."""

    router: Proc
    a: Proc
    b: Proc
    config: Path

    def write(self, w1: float, w2: float, extra: str = "") -> None:
        self.config.write_text(
            config_text(self.router.port, self.a.port, self.b.port, w1, w2, extra)
        )


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    """Sim a serves v1 (llama-v1), sim b serves v2 (llama-v2); stateless, so shared by the file."""
    directory = tmp_path_factory.mktemp("sims")
    procs: list[Proc] = []
    try:
        for name, model in (("a", "llama-v1"), ("b", "llama-v2")):
            procs.append(start_sim(directory, name, models=model, ttft_ms=5, tokens_per_s=2000))
        yield procs[0], procs[1]
    finally:
        for p in procs:
            p.kill()


def start_stack(tmp_path: Path, sims: tuple[Proc, Proc], extra: str = "") -> Stack:
    """A router at 50/50 in front of the two sims."""
    a, b = sims
    port = free_port()
    config = tmp_path / "router.toml"
    config.write_text(config_text(port, a.port, b.port, 50, 50, extra))
    router = spawn(router_cmd("serve", "--config", str(config)), port, tmp_path / "router.log")
    return Stack(router=router, a=a, b=b, config=config)


@pytest.fixture
def stack(tmp_path: Path, sims: tuple[Proc, Proc]) -> Iterator[Stack]:
    s = start_stack(tmp_path, sims)
    yield s
    s.router.kill()


@pytest.fixture
def cached_stack(tmp_path: Path, sims: tuple[Proc, Proc]) -> Iterator[Stack]:
    s = start_stack(tmp_path, sims, "[cache]\nenabled = true\n")
    yield s
    s.router.kill()


def chat(user: str, stream: bool = False) -> dict[str, object]:
    return {
        "model": "chat-default",
        "messages": [{"role": "user", "content": f"hello from {user}"}],
        "user": user,
        "stream": stream,
        "temperature": 0.5,
    }


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, object]
) -> tuple[int, str | None, bytes]:
    async with session.post(url, json=body) as resp:
        return resp.status, resp.headers.get(VERSION), await resp.read()


async def admin(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> bytes:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with session.post(url, json=body, headers=headers) as resp:
        payload = await resp.read()
        assert resp.status == 200, payload
        return payload


async def test_version_header_upstream_model_and_stickiness(stack: Stack) -> None:
    url = stack.router.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s:
        seen: dict[str, str] = {}
        for i in range(40):
            status, version, body = await post(s, url, chat(f"user-{i}"))
            assert status == 200, body
            assert version in ("v1", "v2")
            # the client sees what the upstream said, the version's upstream model name
            assert (
                msgspec.json.decode(body)["model"] == {"v1": "llama-v1", "v2": "llama-v2"}[version]
            )
            seen[f"user-{i}"] = version
        assert set(seen.values()) == {"v1", "v2"}
        # The access log names each request's version (the stack's first requests).
        logged = stack.router.access_lines(40)
        assert [line["version"] for line in logged] == list(seen.values())
        for user, version in list(seen.items())[:10]:
            for stream in (False, True):
                status, again, _ = await post(s, url, chat(user, stream))
                assert (status, again) == (200, version)
        # a plain region model is its own version
        status, version, _ = await post(s, url, {**chat("x"), "model": "llama-v1"})
        assert (status, version) == (200, "llama-v1")
        status, version, body = await post(s, url, {**chat("x"), "model": "nope"})
        assert status == 404
        assert msgspec.json.decode(body)["error"]["code"] == "model_not_found"
        status, _, body = await post(s, url, {**chat("x"), "user": 7})
        assert status == 400
        assert msgspec.json.decode(body)["error"]["param"] == "user"


async def test_rollback_under_load_has_zero_failed_requests(stack: Stack) -> None:
    url = stack.router.url + "/v1/chat/completions"
    results: list[tuple[float, float, int, str | None]] = []
    rolled_back_at: list[float] = []
    third_done = asyncio.Event()
    rolled_back = asyncio.Event()
    slow_started = asyncio.Event()
    busy_on_v2: list[int] = []
    total, workers = 300, 8

    async def worker(w: int, s: aiohttp.ClientSession) -> None:
        for i in range(w, total, workers):
            began = time.monotonic()
            status, version, body = await post(s, url, chat(f"u{i}", stream=i % 2 == 0))
            assert status == 200, body
            assert body.rstrip().endswith(b"[DONE]") if i % 2 == 0 else b'"choices"' in body
            results.append((began, time.monotonic(), status, version))
            if len(results) >= total // 3:
                third_done.set()

    async def roll_back(s: aiohttp.ClientSession) -> None:
        await third_done.wait()
        await admin(s, stack.router.url + "/admin/rollout/rollback", {"model": "chat-default"})
        rolled_back_at.append(time.monotonic())
        async with s.get(stack.b.url + "/sim/stats") as resp:
            busy_on_v2.append(msgspec.json.decode(await resp.read())["active"])
        rolled_back.set()

    async def slow_stream_on_v2(s: aiohttp.ClientSession) -> tuple[str | None, bytes]:
        """A v2 stream that starts before the rollback and is still running after it."""
        i = 0
        while (await post(s, url, chat(f"slow{i}")))[1] != "v2":
            i += 1
        headers = {"x-sim-tokens-per-s": "8"}  # 25 tokens: about 3 s
        async with s.post(url, json=chat(f"slow{i}", stream=True), headers=headers) as resp:
            assert resp.status == 200
            slow_started.set()
            await rolled_back.wait()
            return resp.headers.get(VERSION), await resp.read()

    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(45):
            slow = asyncio.create_task(slow_stream_on_v2(s))
            await slow_started.wait()
            await asyncio.gather(roll_back(s), *(worker(w, s) for w in range(workers)))
            slow_version, slow_body = await slow
    # v2 was still generating when the rollback answered; its in-flight stream finished whole
    assert busy_on_v2[0] >= 1
    assert slow_version == "v2"
    assert slow_body.rstrip().endswith(b"data: [DONE]")
    assert len(results) == total
    assert Counter(status for *_, status, _ in results) == Counter({200: total})
    [cut] = rolled_back_at
    before = Counter(v for began, ended, _, v in results if ended < cut)
    after = Counter(v for began, _, _, v in results if began > cut)
    assert before["v2"] > 0
    assert sum(after.values()) > 0
    assert set(after) == {"v1"}
    stack.router.wait_output("admin rollback: model chat-default -> version v1")


def test_sighup_invalid_config_rejected_then_valid_applied(stack: Stack) -> None:
    url = stack.router.url + "/v1/chat/completions"

    def versions(n: int = 20) -> Counter[str | None]:
        async def run() -> Counter[str | None]:
            async with aiohttp.ClientSession() as s:
                got = [await post(s, url, chat(f"r{i}")) for i in range(n)]
            assert all(status == 200 for status, _, _ in got)
            return Counter(v for _, v, _ in got)

        return asyncio.run(run())

    assert set(versions()) == {"v1", "v2"}
    stack.config.write_text(
        stack.config.read_text().replace('model = "llama-v2"', 'model = "gone"')
    )
    stack.router.popen.send_signal(signal.SIGHUP)
    out = stack.router.wait_output("config reload rejected")
    assert str(stack.config) in out
    assert "rollout.models.chat-default.deployments[1].model" in out
    assert stack.router.popen.poll() is None
    assert set(versions()) == {"v1", "v2"}  # old config still serving
    stack.write(0, 100, extra='[models]\naliases = { fast = "llama-v1" }\n')
    stack.router.popen.send_signal(signal.SIGHUP)
    stack.router.wait_output("config reloaded from")
    assert versions() == Counter({"v2": 20})

    async def new_alias() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(stack.router.url + "/v1/models") as resp:
                listed = [m["id"] for m in msgspec.json.decode(await resp.read())["data"]]
            assert "fast" in listed
            status, version, _ = await post(s, url, {**chat("f"), "model": "fast"})
            assert (status, version) == (200, "llama-v1")

    asyncio.run(new_alias())


async def test_canary_errors_trigger_automatic_rollback(stack: Stack) -> None:
    url = stack.router.url + "/v1/chat/completions"
    headers = {"x-sim-fail": "500", "x-sim-only": "b"}  # only the canary's region fails
    async with aiohttp.ClientSession(headers=headers) as s:
        async with asyncio.timeout(30):
            for i in range(400):
                status, version, _ = await post(s, url, chat(f"c{i}"))
                assert (status == 200) == (version == "v1")
                if "canary rollback" in stack.router.output():
                    break
    out = stack.router.wait_output("canary rollback: model chat-default version v2")
    line = next(ln for ln in out.splitlines() if "canary rollback: model" in ln)
    assert '"level":"warning"' in line
    async with aiohttp.ClientSession(headers=headers) as s:
        got = [await post(s, url, chat(f"c{i}")) for i in range(30)]
    assert all((status, version) == (200, "v1") for status, version, _ in got)


async def test_admin_table_weights_and_errors(stack: Stack) -> None:
    base = stack.router.url + "/admin"
    token = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/rollout", headers=token) as resp:
            assert resp.status == 200
            table = msgspec.json.decode(await resp.read())
        chat_default = table["models"]["chat-default"]
        assert chat_default["stable"] == "v1"
        assert [d["weight"] for d in chat_default["deployments"]] == [50.0, 50.0]
        assert table["auto_rollback"] is True
        assert set(table["window"]["chat-default"]) == {"v1", "v2"}
        moved = msgspec.json.decode(
            await admin(
                s, base + "/rollout/weights", {"model": "chat-default", "weights": {"v1": 0}}
            )
        )
        assert moved["generation"] == table["generation"] + 1
        stack.router.wait_output("admin: model chat-default weights now {'v1': 0.0, 'v2': 50.0}")
        url = stack.router.url + "/v1/chat/completions"
        got = {(await post(s, url, chat(f"w{i}")))[1] for i in range(10)}
        assert got == {"v2"}
        async with s.get(base + "/rollout", headers=token) as resp:
            window = msgspec.json.decode(await resp.read())["window"]["chat-default"]
        assert window["v2"]["samples"] >= 10
        assert window["v2"]["errors"] == 0
        # Whole answers: their time is judged apart from streams' time to first token.
        assert window["v2"]["whole_p95_ms"] > 0
        assert window["v2"]["ttft_p95_ms"] is None
        bad: list[tuple[str, dict[str, object] | bytes, dict[str, str], int, str]] = [
            (
                "/rollout/weights",
                {"model": "chat-default", "weights": {"v1": 0}},
                {},
                401,
                "missing_api_key",
            ),
            (
                "/rollout/weights",
                {"model": "chat-default", "weights": {"v1": 0}},
                {"Authorization": "Bearer wrong-token-123"},
                401,
                "invalid_api_key",
            ),
            ("/rollout/weights", b"{not json", token, 400, "invalid_request"),
            (
                "/rollout/weights",
                {"model": "chat-default", "weights": {"v2": 0}},
                token,
                400,
                "invalid_request",
            ),
            (
                "/rollout/weights",
                {"model": "chat-default", "weights": {"v9": 1}},
                token,
                400,
                "invalid_request",
            ),
            (
                "/rollout/weights",
                {"model": "chat-default", "weights": {"v1": -1}},
                token,
                400,
                "invalid_request",
            ),
            ("/rollout/weights", {"model": "nope", "weights": {}}, token, 404, "model_not_found"),
            (
                "/rollout/rollback",
                {"model": "chat-default", "to": "v7"},
                token,
                404,
                "unknown_version",
            ),
            (
                "/rollout/rollback",
                {"model": "chat-default", "extra": 1},
                token,
                400,
                "invalid_request",
            ),
        ]
        for path, body, headers, status, code in bad:
            data = body if isinstance(body, bytes) else msgspec.json.encode(body)
            async with s.post(base + path, data=data, headers=headers) as resp:
                payload = msgspec.json.decode(await resp.read())
                assert (resp.status, payload["error"]["code"]) == (status, code), (path, payload)
        # none of the refused changes touched the table
        async with s.get(base + "/rollout", headers=token) as resp:
            after = msgspec.json.decode(await resp.read())
        assert after["generation"] == moved["generation"]
        # reload through the admin endpoint: invalid is a 400 naming the field, valid applies
        stack.config.write_text(stack.config.read_text().replace("weight = 50", "weight = -1", 1))
        async with s.post(base + "/reload", headers=token) as resp:
            payload = msgspec.json.decode(await resp.read())
            assert resp.status == 400
            assert payload["error"]["code"] == "invalid_config"
            assert "deployments[0].weight" in payload["error"]["message"]
        stack.write(100, 0)
        async with s.post(base + "/reload", headers=token) as resp:
            assert resp.status == 200
        got = {(await post(s, url, chat(f"w{i}")))[1] for i in range(10)}
        assert got == {"v1"}


async def test_reload_adds_and_drops_regions_without_failing_in_flight(
    stack: Stack, tmp_path: Path
) -> None:
    url = stack.router.url + "/v1/chat/completions"
    token = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    c = start_sim(tmp_path, "c", models="llama-v3", ttft_ms=5, tokens_per_s=2000)
    try:
        regions = {"a": stack.a.port, "b": stack.b.port, "c": c.port}
        weights = {"v1": 50.0, "v2": 50.0, "v3": 0.0}
        stack.config.write_text(general_config(stack.router.port, regions, weights))
        async with aiohttp.ClientSession() as s:
            async with s.post(stack.router.url + "/admin/reload", headers=token) as resp:
                assert resp.status == 200, await resp.read()
            stack.router.wait_output("regions now a, b, c (kept 2 pools, opened 1)")
            only = {"v1": 0, "v2": 0, "v3": 1}
            await admin(
                s,
                stack.router.url + "/admin/rollout/weights",
                {"model": "chat-default", "weights": only},
            )
            got = [await post(s, url, chat(f"c{i}")) for i in range(5)]
            assert {(status, v) for status, v, _ in got} == {(200, "v3")}
            # a v2 stream in flight while region b is dropped finishes whole
            only = {"v2": 1, "v3": 0}
            await admin(
                s,
                stack.router.url + "/admin/rollout/weights",
                {"model": "chat-default", "weights": only},
            )
            headers = {"x-sim-tokens-per-s": "10"}
            async with s.post(url, json=chat("slow", stream=True), headers=headers) as resp:
                assert (resp.status, resp.headers.get(VERSION)) == (200, "v2")
                first = await resp.content.readany()
                stack.config.write_text(
                    general_config(stack.router.port, {"a": stack.a.port}, {"v1": 100.0})
                )
                async with s.post(stack.router.url + "/admin/reload", headers=token) as r2:
                    assert r2.status == 200, await r2.read()
                rest = await resp.read()
            assert (first + rest).rstrip().endswith(b"data: [DONE]")
            stack.router.wait_output("regions now a (kept 1 pools, opened 0)")
            got = [await post(s, url, chat(f"d{i}")) for i in range(5)]
            assert {(status, v) for status, v, _ in got} == {(200, "v1")}
    finally:
        c.kill()


async def test_cache_hits_carry_the_version_and_versions_never_share_entries(
    cached_stack: Stack,
) -> None:
    url = cached_stack.router.url + "/v1/chat/completions"
    # no `user`: stickiness falls back to the API key; the two keys land on different versions
    body = {
        "model": "chat-default",
        "messages": [{"role": "user", "content": "same"}],
        "temperature": 0,
    }
    keys: dict[str, str] = {}
    first_seen: dict[str, str] = {}
    async with aiohttp.ClientSession() as s:
        for i in range(64):
            key = f"sk-key-{i}"
            async with s.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
                assert resp.status == 200
                keys.setdefault(resp.headers[VERSION], key)
                first_seen.setdefault(resp.headers[VERSION], resp.headers["x-cache"])
            if len(keys) == 2:
                break
        assert set(keys) == {"v1", "v2"}
        # the second version's first answer was not the first version's cached one
        assert first_seen == {"v1": "MISS", "v2": "MISS"}
        for version, key in keys.items():
            async with s.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
                assert resp.headers["x-cache"] == "HIT"
                assert resp.headers[VERSION] == version
                assert msgspec.json.decode(await resp.read())["model"] == f"llama-{version}"


def test_versions_of_one_upstream_model_in_regions_of_their_own_never_share_entries(
    tmp_path: Path,
) -> None:
    """A canary that keeps the served model's name and runs in a region of its own (new
    weights or engine behind the same name) gets its own cache entries: the key held only the
    upstream model, so each version got the other's cached answers."""
    sims = [
        start_sim(tmp_path, name, models="llama", ttft_ms=5, tokens_per_s=2000)
        for name in ("stable", "canary")
    ]
    port = free_port()
    config = tmp_path / "router.toml"
    regions = "".join(
        f'[[regions]]\nname = "{name}"\nbase_url = "http://127.0.0.1:{sim.port}"\n'
        'models = ["llama"]\n\n'
        for name, sim in zip(("stable", "canary"), sims, strict=True)
    )
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\n\n[auth]\nenabled = false\n\n'
        f"[cache]\nenabled = true\n\n{regions}"
        '[rollout.models.chat]\nstable = "v1"\ndeployments = [\n'
        '  { version = "v1", model = "llama", regions = ["stable"], weight = 50 },\n'
        '  { version = "v2", model = "llama", regions = ["canary"], weight = 50 },\n]\n'
    )
    router = spawn(router_cmd("serve", "--config", str(config)), port, tmp_path / "router.log")
    try:

        def ask(user: str) -> tuple[str, str, str | None]:
            body = {"model": "chat", "messages": [{"role": "user", "content": "same"}]}
            got = call(
                router.url + "/v1/chat/completions", {**body, "user": user, "temperature": 0}
            )
            assert got.status == 200, got.body
            h = got.headers
            return h[VERSION], h["x-cache"], h.get("x-router-region")

        seen: dict[str, list[tuple[str, str | None]]] = {}
        for i in range(64):
            version, outcome, region = ask(f"user-{i}")
            seen.setdefault(version, []).append((outcome, region))
            if all(len(seen.get(v, ())) >= 2 for v in ("v1", "v2")):
                break
        # Each version's first answer came from its own region; only its later ones are hits.
        assert seen["v1"][:2] == [("MISS", "stable"), ("HIT", None)]
        assert seen["v2"][:2] == [("MISS", "canary"), ("HIT", None)]
    finally:
        router.kill()
        for sim in sims:
            sim.kill()
