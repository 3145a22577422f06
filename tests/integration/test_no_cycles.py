"""The request path leaves no reference cycles: refcounting frees every request's objects.

A cycle per request leaves the cycle collector tens of thousands of objects to walk and free
at a time, a pause of tens of milliseconds for every request in flight (and CPU for all). The
router runs in process (build_app, real sockets on 127.0.0.1) in front of a simulated region
subprocess, with auth, limits, the cache, rollout and hedging on; the requests cover whole
answers, streams, cache hits and refusals. Errors that end an exchange with a traceback may
leave cycles (an exception holds its frames): they are rare, and left to the collector.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from router.access.auth import hash_key
from router.config import loads
from router.server.app import build_app
from tests.integration.conftest import region_toml, start_sim
from tests.support import Proc

KEY = "sk-cycles-0123456789abcdef"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_sim(tmp_path_factory.mktemp("sim"), "a")
    yield proc
    proc.kill()


def _config(sim: Proc) -> str:
    return f"""
[health]
enabled = false
[auth]
[[auth.keys]]
sha256 = "{hash_key(KEY)}"
tenant = "t"
requests_per_minute = 100000
tokens_per_minute = 10000000
[cache]
enabled = true
[routing]
hedge_endpoints = ["/v1/completions"]
hedge_delay_ms = 5000.0
[[rollout.models.alias.deployments]]
version = "v1"
model = "sim-1"
weight = 1.0
{region_toml(sim)}
"""


def _router_garbage() -> list[str]:
    """Types, from the router's own modules, of the objects only a cycle keeps alive now."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [
            f"{type(obj).__module__}.{type(obj).__qualname__}"
            for obj in gc.garbage
            if type(obj).__module__.startswith("router.")
        ]
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    return found


async def _requests(session: aiohttp.ClientSession, server: TestServer) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    chat = server.make_url("/v1/chat/completions")
    messages = [{"role": "user", "content": "cycles"}]
    asks: list[tuple[dict[str, object], dict[str, str], int]] = [
        ({"model": "sim-1", "messages": messages, "temperature": 0}, auth, 200),
        ({"model": "sim-1", "messages": messages, "temperature": 0}, auth, 200),  # a cache hit
        ({"model": "sim-1", "messages": messages, "stream": True, "temperature": 0}, auth, 200),
        ({"model": "sim-1", "messages": messages, "stream": True, "temperature": 0}, auth, 200),
        ({"model": "alias", "messages": messages, "temperature": 1.0}, auth, 200),
        ({"model": "nope", "messages": messages}, auth, 404),
        ({"model": "sim-1", "messages": "not a list"}, auth, 400),
        ({"model": "sim-1", "messages": messages}, {}, 401),
    ]
    outcomes = []
    for body, headers, status in asks:
        async with session.post(chat, json=body, headers=headers) as resp:
            await resp.read()
            assert resp.status == status, body
            outcomes.append(resp.headers.get("x-cache"))
    assert outcomes[1] == outcomes[3] == "HIT", outcomes
    completions = server.make_url("/v1/completions")
    body = {"model": "sim-1", "prompt": "cycles", "stream": True, "temperature": 1.0}
    async with session.post(completions, json=body, headers=auth) as resp:
        assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    bad = {**auth, "Content-Type": "application/json"}
    async with session.post(chat, data=b"{not json", headers=bad) as resp:
        assert resp.status == 400, json.loads(await resp.read())


async def test_requests_leave_no_cycles_of_router_objects(sim: Proc, tmp_path: Path) -> None:
    server = TestServer(build_app(loads(_config(sim), "cycles.toml")), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            await _requests(session, server)  # warm: what is built once is built
            gc.collect()
            gc.disable()
            try:
                for _ in range(3):
                    await _requests(session, server)
                assert _router_garbage() == []
            finally:
                gc.enable()
    finally:
        await server.close()
