"""Hedging over real sockets: the router in process (build_app, its own pools and admission),
scripted regions on 127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from router.config import loads
from router.server.app import build_app

ADMIN = "admin-hedge-0123456789abcdef"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chat_chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _event({"id": "chatcmpl-h", "created": 1, "model": "m", "choices": [choice]})


_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_FIRST = _chunk(_chat_chunk({"role": "assistant", "content": ""}) + _chat_chunk({"content": "Hel"}))
_REST = _chunk(_chat_chunk({}, "stop") + b"data: [DONE]\n\n") + b"0\r\n\r\n"


class SameMoment:
    """Streams held until both regions have theirs, then both heads and first tokens sent in
    one step: the router reads them in the same turn of its event loop."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.finish = asyncio.Event()

    async def stream(self, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if len(self.writers) == 2:
            for w in self.writers:
                w.write(_HEAD + _FIRST)
        await self.finish.wait()
        writer.write(_REST)
        await writer.drain()


class Region:
    """A region answering streams through `moment` and anything else with a whole answer;
    `closed` is set once the router hung up on it."""

    def __init__(self, name: str, moment: SameMoment) -> None:
        self.name = name
        self.moment = moment
        self.closed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = json.loads(await reader.readexactly(length))
                if body.get("stream"):
                    await self.moment.stream(writer)
                    continue
                message = {"role": "assistant", "content": f"from {self.name}"}
                answer = json.dumps({"choices": [{"index": 0, "message": message}]}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


@pytest.fixture
async def regions() -> AsyncIterator[Callable[[str, SameMoment], Any]]:
    servers: list[asyncio.Server] = []

    async def start(name: str, moment: SameMoment) -> tuple[Region, int]:
        region = Region(name, moment)
        server = await asyncio.start_server(region.handle, "127.0.0.1", 0)
        servers.append(server)
        port: int = server.sockets[0].getsockname()[1]
        return region, port

    yield start
    for server in servers:
        server.close()


async def test_a_hedge_answered_in_the_same_turn_as_the_first_attempt_lets_the_loser_go(
    regions: Callable[[str, SameMoment], Any],
) -> None:
    """Issue: when both attempts of a hedge got their first byte in the same turn, the one not
    returned was never closed: its pooled connection stayed held by a response nobody read
    (for good: its deadline ends with its body) and its admission slot until the request
    ended. With max_connections = 1, every later request to that region waited for a
    connection and failed as a timeout of the region."""
    moment = SameMoment()
    a, port_a = await regions("a", moment)
    b, port_b = await regions("b", moment)
    config = loads(
        f"""
[timeouts]
first_byte = 3.0
[health]
enabled = false
[auth]
enabled = false
admin_token_sha256 = "{hashlib.sha256(ADMIN.encode()).hexdigest()}"
[routing]
hedge_endpoints = ["/v1/chat/completions"]
hedge_delay_ms = 50.0
tolerance_ms = 5.0
[[regions]]
name = "a"
base_url = "http://127.0.0.1:{port_a}/v1"
models = ["m", "only-a"]
max_connections = 1
[[regions]]
name = "b"
base_url = "http://127.0.0.1:{port_b}/v1"
models = ["m", "only-b"]
bias_ms = 100.0
max_connections = 1
""",
        "hedge.toml",
    )
    server = TestServer(build_app(config), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:

            async def in_flight() -> dict[str, int]:
                url = server.make_url("/admin/health")
                headers = {"Authorization": f"Bearer {ADMIN}"}
                async with session.get(url, headers=headers) as resp:
                    shown = await resp.json()
                return {r["name"]: r["in_flight"] for r in shown["regions"]}

            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with session.post(server.make_url("/v1/chat/completions"), json=body) as resp:
                assert resp.status == 200
                # Both first bytes came in the same turn: the first attempt's wins.
                assert (resp.headers["x-router-region"], resp.headers["x-router-hedged"]) == (
                    "a",
                    "b",
                )
                first = await resp.content.readuntil(b"\n\n")
                assert b"role" in first or b"Hel" in first
                # While a's stream goes on, b's attempt holds nothing: no slot, no connection.
                assert await in_flight() == {"a": 1, "b": 0}
                moment.finish.set()
                rest = await resp.read()
            assert rest.endswith(b"data: [DONE]\n\n")
            # The region saw its request closed, as for any hedge's loser.
            await asyncio.wait_for(b.closed.wait(), 5.0)
            assert not a.closed.is_set()
            assert await in_flight() == {"a": 0, "b": 0}
            # Each region's one connection is free for the next request.
            for model, region in (("only-a", "a"), ("only-b", "b")):
                ask = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                url = server.make_url("/v1/chat/completions")
                async with session.post(url, json=ask) as answer:
                    assert answer.status == 200, await answer.text()
                    assert answer.headers["x-router-region"] == region
    finally:
        await server.close()
