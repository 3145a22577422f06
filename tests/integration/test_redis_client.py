"""open_redis against a real redis-server through a counting proxy: what a new connection costs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis

from router.net.redis_client import OUTAGE, open_redis
from tests.support import Proc, cluster_port, start_redis

pytestmark = pytest.mark.redis


class Relay:
    """A TCP relay on 127.0.0.1 to the Redis at port `target` (subclasses relay the bytes)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class TurnProxy(Relay):
    """A relay that notes, per connection, each time the client starts sending after the
    server last spoke: one turn is one round trip the client waited for."""

    def __init__(self, target: int) -> None:
        super().__init__(target)
        self.turns: list[int] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        index = len(self.turns)
        self.turns.append(0)
        # The direction of the last bytes relayed: a client write after a server one is a turn.
        last = ["server"]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, side: str) -> None:
            while data := await src.read(65536):
                if side == "client" and last[0] == "server":
                    self.turns[index] += 1
                last[0] = side
                dst.write(data)
                await dst.drain()
            dst.close()

        with contextlib.suppress(OSError):
            await asyncio.gather(
                pump(reader, up_writer, "client"), pump(up_reader, writer, "server")
            )


@pytest.fixture
async def proxy(redis_proc: Proc) -> AsyncIterator[TurnProxy]:
    p = TurnProxy(redis_proc.port)
    await p.start()
    yield p
    await p.close()


async def test_a_cold_call_is_one_round_trip(proxy: TurnProxy) -> None:
    # A far Redis pays each exchange before the command on every new connection; a handshake
    # of three (HELLO 3, CLIENT MAINT_NOTIFICATIONS, the command) outlived the callers' timeouts.
    client = open_redis(f"redis://127.0.0.1:{proxy.port}/0", timeout_s=5.0)
    try:
        assert await client.set("k", b"v")
        assert await client.get("k") == b"v"
        assert await client.eval("return redis.call('GET', KEYS[1])", 1, "k") == b"v"
    finally:
        await client.aclose()
    assert proxy.turns == [3]  # one connection, one round trip per command


class DelayProxy(Relay):
    """A relay that holds every chunk `delay_s` in each direction: a far Redis (the connect
    itself stays local; AUTH, SELECT and each command pay the round trip)."""

    def __init__(self, target: int, delay_s: float) -> None:
        super().__init__(target)
        self.delay_s = delay_s
        self.connections = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                await asyncio.sleep(self.delay_s)
                dst.write(data)
                await dst.drain()
            dst.close()

        with contextlib.suppress(OSError):
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


async def test_a_handshake_outlives_a_caller_that_gave_up(tmp_path: Path) -> None:
    """Issue: a call's timeout that cancelled a new connection's handshake threw the
    connection away, so with a Redis whose handshake takes longer than a call's timeout (here
    AUTH and SELECT, two round trips; far away, TCP and TLS add theirs) every call started cold
    again and none ever got an answer."""
    server = start_redis(tmp_path, password="pw-far-away")
    proxy = DelayProxy(server.port, delay_s=0.1)  # 0.2 s a round trip
    await proxy.start()
    client = open_redis(f"redis://:pw-far-away@127.0.0.1:{proxy.port}/1", timeout_s=1.0)
    try:
        # Cold: the caller gives up inside the handshake (0.4 s), before sending its command.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.ping()
        await asyncio.sleep(0.3)  # the handshake ends meanwhile
        for _ in range(3):
            async with asyncio.timeout(0.3):
                assert await client.ping()
        assert proxy.connections == 1
    finally:
        await client.aclose()
        await proxy.close()
        server.kill()


async def test_a_cluster_nodes_handshake_outlives_a_caller_that_gave_up(tmp_path: Path) -> None:
    """The same for a Redis Cluster's node (its client connects on another path): a one-node
    cluster with a password, announced at a delaying proxy's port."""
    proxy = DelayProxy(0, delay_s=0.1)  # bound first: its port is the one the node announces
    await proxy.start()
    announced = proxy.port
    server = start_redis(
        tmp_path,
        cluster_port(),  # its bus port, 10000 higher, must fit too
        password="pw-far-away",
        extra=[
            *("--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf")),
            *("--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", str(announced)),
        ],
    )
    direct = redis.Redis(port=server.port, password="pw-far-away")
    direct.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    for _ in range(100):  # the node takes its slots in a moment
        if b"cluster_state:ok" in direct.execute_command("CLUSTER", "INFO"):
            break
        await asyncio.sleep(0.05)
    direct.close()
    proxy.target = server.port
    client = open_redis(
        f"redis://:pw-far-away@127.0.0.1:{announced}/0", timeout_s=1.0, cluster=True
    )
    try:
        for _ in range(100):  # the slot map, learnt without a caller's limit
            with contextlib.suppress(*OUTAGE):
                await client.initialize()
                break
            await asyncio.sleep(0.1)
        node = client.get_default_node()
        await node.disconnect()  # the next call opens a connection
        opened = proxy.connections
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.15):  # gives up inside AUTH (0.2 s)
                await client.set("k", b"v")
        await asyncio.sleep(0.4)
        for _ in range(3):
            async with asyncio.timeout(0.3):
                await client.get("k")
        assert proxy.connections == opened + 1
    finally:
        await client.aclose()
        await proxy.close()
        server.kill()
