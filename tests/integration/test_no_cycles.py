"""The request path leaves no reference cycles: refcounting frees every request's objects.

A cycle per request leaves the cycle collector tens of thousands of objects to walk and free
at a time, a pause of tens of milliseconds for every request in flight (and CPU for all). The
router runs in process (build_app, real sockets on 127.0.0.1) in front of a simulated region
subprocess, with auth, limits, the cache, rollout and hedging on; the requests cover whole
answers, streams, cache hits and refusals. A failed attempt at a region is no exception (an
exception holds the frames it passed, which hold the request): refused connections, error
statuses, resets, silences, hedges and streams broken mid-way leave none either.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from router.access.auth import hash_key
from router.config import loads
from router.observability.logs import Redactor
from router.server.app import build_app
from tests.integration.conftest import region_toml, start_sim
from tests.support import Proc, free_port

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


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    directory = tmp_path_factory.mktemp("pair")
    a = start_sim(directory, "a", models="sim-1,sim-2")
    b = start_sim(directory, "b", models="sim-1,sim-2")
    yield a, b
    a.kill()
    b.kill()


@pytest.fixture
def records_let_go() -> Iterator[None]:
    """pytest keeps every log record of a test, with its args (a failure logged with `%s`):
    the router's own handler formats a record and drops it. This lets the kept ones go of
    what they name, as the router's Redactor does, so they keep no failure alive."""
    redactor = Redactor()
    loggers = [logging.getLogger(name) for name in ("router", "router.health")]
    for logger in loggers:
        logger.addFilter(redactor)
    yield
    for logger in loggers:
        logger.removeFilter(redactor)


def _failing_config(a: Proc, b: Proc) -> str:
    # Region z (nothing listens on its port) is the first for sim-2; a is the first for sim-1,
    # whatever its failures (no circuit, health flip or ejection takes it out of the way).
    # Chat hedges (after 100 ms), completions do not; a broken stream resumes at another region.
    return f"""
[timeouts]
first_byte = 0.5
idle = 0.5
[health]
enabled = false
unhealthy_after = 1000000
eject_after = 1000000
[auth]
enabled = false
[cache]
enabled = false
[routing]
tolerance_ms = 5.0
midstream = "resume"
hedge_endpoints = ["/v1/chat/completions"]
hedge_delay_ms = 100.0
circuit_after = 1000000
retry_budget_min = 1000000
[[regions]]
name = "z"
base_url = "http://127.0.0.1:{free_port()}/v1"
models = ["sim-2"]
kind = "sim"
{region_toml(a, models=("sim-1", "sim-2"), bias_ms=100.0)}
{region_toml(b, models=("sim-1", "sim-2"), bias_ms=2000.0)}
"""


_ONLY_A = {"x-sim-only": "a"}
_CUT = {"x-sim-fail": "die-mid-stream", "x-sim-after-tokens": "2"}
_CHAT = "chat/completions"
_DONE = b"data: [DONE]\n\n"
# (endpoint, what the body adds, the sim's fault headers, the answer's status, the attempts it
# took (the x-router-attempts header) and how it ends)
_FAILURES: list[tuple[str, dict[str, object], dict[str, str], int, str, bytes]] = [
    # A region that refuses the connection.
    (_CHAT, {"model": "sim-2"}, {}, 200, "2", b"}"),
    ("completions", {"model": "sim-2", "stream": True}, {}, 200, "2", _DONE),
    # A server error, then failover; at every region.
    (_CHAT, {"stream": True}, {"x-sim-fail": "500", **_ONLY_A}, 200, "2", _DONE),
    ("completions", {}, {"x-sim-fail": "500"}, 500, "2", b"}"),
    # A connection reset before the head, and one in the middle of the body.
    (_CHAT, {}, {"x-sim-fail": "refuse", **_ONLY_A}, 200, "2", b"}"),
    ("completions", {}, {"x-sim-fail": "die-mid-stream", **_ONLY_A}, 200, "2", b"}"),
    # No first byte in time: hedged (the loser cancelled), silent everywhere, not hedged.
    (_CHAT, {}, {"x-sim-fail": "hang", **_ONLY_A}, 200, "2", b"}"),
    (_CHAT, {}, {"x-sim-fail": "hang"}, 504, "2", b"}"),
    ("completions", {}, {"x-sim-fail": "hang", **_ONLY_A}, 200, "2", b"}"),
    # An error event before the first token.
    (
        "completions",
        {"stream": True},
        {"x-sim-fail": "error-event", "x-sim-after-tokens": "0", **_ONLY_A},
        200,
        "2",
        _DONE,
    ),
    # A stream broken mid-way: resumed at another region, or broken there too.
    (_CHAT, {"stream": True, "temperature": 0}, {**_CUT, **_ONLY_A}, 200, "1", _DONE),
    ("completions", {"stream": True, "temperature": 0}, _CUT, 200, "1", b"}\n\n"),
]


async def _failing_requests(session: aiohttp.ClientSession, server: TestServer) -> None:
    for endpoint, extra, headers, status, attempts, ending in _FAILURES:
        if endpoint == _CHAT:
            body: dict[str, object] = {"messages": [{"role": "user", "content": "cycles"}]}
        else:
            body = {"prompt": "cycles"}
        body = {"model": "sim-1", **body, **extra}
        url = server.make_url(f"/v1/{endpoint}")
        async with session.post(url, json=body, headers=headers) as resp:
            answer = await resp.read()
            got = (resp.status, resp.headers.get("x-router-attempts"), answer.endswith(ending))
            assert got == (status, attempts, True), (body, headers, answer[-200:])


@pytest.mark.usefixtures("records_let_go")
async def test_failed_attempts_leave_no_cycles_of_router_objects(
    pair: tuple[Proc, Proc],
) -> None:
    server = TestServer(build_app(loads(_failing_config(*pair), "cycles.toml")), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            await _failing_requests(session, server)  # warm: what is built once is built
            gc.collect()
            gc.disable()
            try:
                for _ in range(3):
                    await _failing_requests(session, server)
                assert _router_garbage() == []
            finally:
                gc.enable()
    finally:
        await server.close()
