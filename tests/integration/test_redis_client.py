"""open_redis against a real redis-server through a counting proxy: what a new connection costs."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import MaxConnectionsError

from router.net.redis_client import OUTAGE, Client, open_redis
from tests.support import (
    Proc,
    RedisClusterProcs,
    cluster_port,
    redis_clients,
    start_redis,
)

pytestmark = pytest.mark.redis


class Relay:
    """A TCP relay on 127.0.0.1 to the Redis at port `target` (subclasses relay the bytes)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end the relays still going (a delayed chunk may be in flight)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in self._relays:
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            await self._handle(reader, writer)
        finally:
            self._relays.discard(task)
            writer.close()

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

        try:
            with contextlib.suppress(OSError):
                await asyncio.gather(
                    pump(reader, up_writer, "client"), pump(up_reader, writer, "server")
                )
        finally:
            up_writer.close()


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

        try:
            with contextlib.suppress(OSError):
                await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            up_writer.close()


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


@contextlib.asynccontextmanager
async def far_cluster(tmp_path: Path) -> AsyncIterator[tuple[DelayProxy, RedisCluster]]:
    """A one-node Redis Cluster with a password, announced at a delaying proxy's port (0.2 s a
    round trip), and a client that has learnt its slot map."""
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
        f"redis://:pw-far-away@127.0.0.1:{announced}/0", timeout_s=2.0, cluster=True
    )
    assert isinstance(client, RedisCluster)
    try:
        for _ in range(100):  # the slot map, learnt without a caller's limit
            with contextlib.suppress(*OUTAGE):
                await client.initialize()
                break
            await asyncio.sleep(0.1)
        yield proxy, client
    finally:
        await client.aclose()
        await proxy.close()
        server.kill()


async def test_a_cluster_nodes_handshake_outlives_a_caller_that_gave_up(tmp_path: Path) -> None:
    """The same for a Redis Cluster's node (its client connects on another path)."""
    async with far_cluster(tmp_path) as (proxy, client):
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


# A caller's bound shorter than the far Redis's round trip (0.2 s), which the socket timeout
# (2 s, the client's own bound on a reply) is not.
GIVE_UP_S = 0.05


async def idle(client: Client) -> None:
    """Until every connection of `client` is back in its pool (a call the caller gave up on
    holds its connection until its reply; a closed one comes back at once)."""
    for _ in range(500):
        if isinstance(client, RedisCluster):
            nodes = client.get_nodes()
            if all(len(node._free) == len(node._connections) for node in nodes):
                return
        elif not client.connection_pool._in_use_connections:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("a connection is still in use")


async def given_up(call: Awaitable[object]) -> None:
    """`call` under a caller's bound it cannot meet: the caller gets its TimeoutError."""
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(GIVE_UP_S):
            await call


@pytest.fixture
async def far(tmp_path: Path) -> AsyncIterator[tuple[DelayProxy, Client]]:
    """A Redis with a password 0.2 s a round trip away, and a client with one warm connection."""
    server = start_redis(tmp_path, password="pw-far-away")
    proxy = DelayProxy(server.port, delay_s=0.1)
    await proxy.start()
    client = open_redis(f"redis://:pw-far-away@127.0.0.1:{proxy.port}/0", timeout_s=2.0)
    try:
        assert await client.ping()  # the connection made (AUTH) before the callers give up
        assert proxy.connections == 1
        yield proxy, client
    finally:
        await client.aclose()
        await proxy.close()
        server.kill()


async def test_a_sent_command_outlives_a_caller_that_gave_up(
    far: tuple[DelayProxy, Client],
) -> None:
    """Issue: a command cancelled after it was sent (the caller's timeout, shorter than a far
    Redis's round trip) made redis-py close its connection, so each next call paid a new
    connect (TCP, TLS, AUTH) and the pool churned. Now the command goes on to its reply, read
    and dropped, and the connection goes back to the pool: one connection for all the calls."""
    proxy, client = far
    for _ in range(3):
        await given_up(client.incr("n"))
        await idle(client)
    assert proxy.connections == 1
    # Each command ran once, and its reply was read off the connection: no reply is left over
    # on the stream for the next call to take for its own.
    assert await client.get("n") == b"3"


async def test_pipelines_scripts_and_transactions_outlive_a_caller_that_gave_up(
    far: tuple[DelayProxy, Client],
) -> None:
    """The same for what the router sends besides single commands: the global limits' pipeline
    of EVALs, a MULTI/EXEC transaction, a script by EVALSHA (NOSCRIPT, then SCRIPT LOAD)."""
    proxy, client = far
    incr = "return redis.call('INCRBY', KEYS[1], ARGV[1])"

    pipe = client.pipeline(transaction=False)
    pipe.eval(incr, 1, "n", 1)
    pipe.eval(incr, 1, "n", 2)
    await given_up(pipe.execute(raise_on_error=False))
    await idle(client)

    async with client.pipeline(transaction=True) as tx:
        tx.incrby("n", 4)
        tx.incrby("n", 8)
        await given_up(tx.execute())
    await idle(client)

    assert await client.script_flush()  # EVAL cached the script: it is unknown again
    script = client.register_script(incr)
    await given_up(script(keys=["n"], args=[16]))  # EVALSHA: NOSCRIPT, read and dropped
    await idle(client)
    assert proxy.connections == 1
    assert await script(keys=["n"], args=[32]) == 1 + 2 + 4 + 8 + 32  # SCRIPT LOAD, EVALSHA
    await given_up(script(keys=["n"], args=[64]))  # EVALSHA of the loaded script
    await idle(client)

    assert proxy.connections == 1
    assert await client.get("n") == b"%d" % (1 + 2 + 4 + 8 + 32 + 64)


async def test_a_command_not_sent_when_its_caller_gave_up_is_never_sent(tmp_path: Path) -> None:
    """A caller that gives up inside the connection's handshake leaves the handshake going,
    not its command: nothing it asked for reaches Redis later behind its back."""
    server = start_redis(tmp_path, password="pw-far-away")
    proxy = DelayProxy(server.port, delay_s=0.1)
    await proxy.start()
    client = open_redis(f"redis://:pw-far-away@127.0.0.1:{proxy.port}/0", timeout_s=2.0)
    try:
        await given_up(client.incr("n"))  # inside AUTH (0.2 s)
        await idle(client)
        assert await client.get("n") is None
        assert proxy.connections == 1
    finally:
        await client.aclose()
        await proxy.close()
        server.kill()


async def test_a_cluster_command_outlives_a_caller_that_gave_up(tmp_path: Path) -> None:
    """The same for a Redis Cluster's node: a command and a pipeline given up once sent."""
    async with far_cluster(tmp_path) as (proxy, client):
        assert await client.ping()  # the node's connection made (AUTH)
        opened = proxy.connections
        for _ in range(3):
            await given_up(client.incr("{t}n"))
            await idle(client)
        pipe = client.pipeline()
        pipe.incr("{t}n")
        pipe.incr("{t}n")
        await given_up(pipe.execute())
        await idle(client)
        assert proxy.connections == opened
        assert await client.get("{t}n") == b"5"


async def test_calls_left_going_end_with_the_client(far: tuple[DelayProxy, Client]) -> None:
    """A call left going when the client closes is stopped and its task ended, nothing left
    pending or unretrieved."""
    _, client = far
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    await given_up(client.get("k"))
    left = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "_run"]
    assert len(left) == 1
    await client.aclose()
    assert left[0].done()
    del left
    gc.collect()
    assert errors == []


# A small bound on a client's connections, and ten times as many calls at once while Redis is
# stalled (SIGSTOP: the kernel still accepts connections, nothing answers).
CAP = 4
CALLS = 40
# The callers' bound: they give up long before the socket timeout (2 s), so no connection of
# the stall is closed and reopened before Redis is let go.
STALL_GIVE_UP_S = 0.3


async def stalled_calls(call: Callable[[], Awaitable[object]]) -> list[BaseException | None]:
    """CALLS calls at once, each given up after STALL_GIVE_UP_S: what each raised."""

    async def one() -> BaseException | None:
        try:
            async with asyncio.timeout(STALL_GIVE_UP_S):
                await call()
        except OUTAGE as exc:
            return exc
        return None

    return list(await asyncio.gather(*(one() for _ in range(CALLS))))


async def test_a_stalled_redis_gets_at_most_max_connections(redis_proc: Proc) -> None:
    """Issue: the pool was unbounded, so with Redis stalled every call opened one more
    connection while the others waited for their replies (CALLS here; thousands under load,
    up to Redis's maxclients or the router's file descriptors). Now the calls beyond the bound
    wait for a connection and fail at their caller's bound like a call Redis did not answer,
    and once Redis answers again the same connections serve everything."""
    client = open_redis(
        f"redis://127.0.0.1:{redis_proc.port}/0", timeout_s=2.0, max_connections=CAP
    )
    assert isinstance(client, aioredis.Redis)
    try:
        assert await client.set("k", b"v")
        redis_proc.popen.send_signal(signal.SIGSTOP)
        try:
            failed = await stalled_calls(lambda: client.get("k"))
            pool = client.connection_pool
            opened = len(pool._available_connections) + len(pool._in_use_connections)
        finally:
            redis_proc.popen.send_signal(signal.SIGCONT)
        assert all(isinstance(exc, TimeoutError) for exc in failed), failed
        assert opened == CAP
        # The calls sent before Redis stalled get their replies and give their connections back.
        await client.calls.settle()  # type: ignore[attr-defined]
        open_now, accepted = redis_clients(redis_proc.port)
        assert open_now == CAP
        assert await asyncio.gather(*(client.get("k") for _ in range(CALLS))) == [b"v"] * CALLS
        assert redis_clients(redis_proc.port) == (CAP, accepted + 1)  # + the query's own
    finally:
        await client.aclose()


async def test_a_stalled_cluster_node_gets_at_most_max_connections(
    redis_cluster: RedisClusterProcs,
) -> None:
    """The same for a Redis Cluster's node. Issue: with its connections all held, a call to it
    opened none but failed at once with redis-py's MaxConnectionsError (its cluster nodes have
    no waiting pool), an outage to its caller where a single server's call waits. Now it waits
    for one as a single server's does and fails at its caller's bound; afterwards the same
    connections serve again."""
    client = open_redis(redis_cluster.url, timeout_s=2.0, max_connections=CAP, cluster=True)
    assert isinstance(client, RedisCluster)
    try:
        assert await client.set("{t}k", b"v")
        master = redis_cluster.master_of("{t}k")
        # Our client's connections there: the node's one, and any the slot map was read on.
        before, _ = redis_clients(master.port)
        # Stopped for well under the cluster's node timeout (1 s): no failover meanwhile.
        master.popen.send_signal(signal.SIGSTOP)
        try:
            failed = await stalled_calls(lambda: client.get("{t}k"))
            node = client.get_node("127.0.0.1", master.port)
            assert node is not None
            opened = len(node._connections)
        finally:
            master.popen.send_signal(signal.SIGCONT)
        assert all(isinstance(exc, TimeoutError) for exc in failed), failed
        assert opened == CAP
        await client.calls.settle()  # type: ignore[attr-defined]
        open_now, accepted = redis_clients(master.port)
        assert open_now == before - 1 + CAP
        answers = await asyncio.gather(*(client.get("{t}k") for _ in range(CALLS)))
        assert answers == [b"v"] * CALLS
        assert redis_clients(master.port) == (open_now, accepted + 1)
    finally:
        await client.aclose()


# How long a Cluster node is stopped while calls queue for its connections: well under the
# cluster's node timeout (1 s), so no failover meanwhile.
PAUSE_S = 0.3


async def piped_get(client: Client, key: str) -> object:
    """GET `key` in a pipeline of its own."""
    pipe = client.pipeline(transaction=False)
    pipe.get(key)
    (value,) = await pipe.execute()
    return value


async def test_calls_past_a_cluster_node_s_bound_wait_for_a_connection(
    redis_cluster: RedisClusterProcs,
) -> None:
    """Issue: a burst of more calls than `max_connections` to a slow Cluster node (a far one:
    a round trip of 50-150 ms keeps many calls in flight) failed all those past the bound at
    once with MaxConnectionsError, an outage to their callers (the cache tier switched itself
    off). Now they wait for a connection as a single server's calls do: all of them are
    answered once the node answers again, commands and pipelines alike, and the node gets no
    more than the bound's connections."""
    client = open_redis(redis_cluster.url, timeout_s=2.0, max_connections=CAP, cluster=True)
    assert isinstance(client, RedisCluster)
    try:
        assert await client.set("{t}k", b"v")
        master = redis_cluster.master_of("{t}k")
        before, accepted = redis_clients(master.port)
        node = client.get_node("127.0.0.1", master.port)
        assert node is not None
        master.popen.send_signal(signal.SIGSTOP)
        try:
            calls = [client.get("{t}k") for _ in range(CALLS // 2)]
            calls += [piped_get(client, "{t}k") for _ in range(CALLS // 2)]
            answering = asyncio.gather(*calls, return_exceptions=True)
            await asyncio.sleep(PAUSE_S)
            opened = len(node._connections)
        finally:
            master.popen.send_signal(signal.SIGCONT)
        async with asyncio.timeout(10):
            answers = await answering
        assert answers == [b"v"] * CALLS
        assert opened == CAP
        assert len(node._connections) == CAP
        # The node's own connection and the query's are counted in `before` and `accepted`.
        assert redis_clients(master.port) == (before - 1 + CAP, accepted + CAP)
    finally:
        await client.aclose()


async def test_a_cluster_call_waits_for_a_connection_at_most_its_timeout(
    redis_cluster: RedisClusterProcs,
) -> None:
    """With the node stopped for longer than the client's timeout, the calls waiting for its
    connections give up within that bound (not after the calls ahead of them: ten times as
    long here) and fail as an outage, MaxConnectionsError for those that never got one, as a
    single server's (ConnectionError) does; none gives up before it waited."""
    timeout_s = 0.2
    client = open_redis(redis_cluster.url, timeout_s=timeout_s, max_connections=CAP, cluster=True)
    assert isinstance(client, RedisCluster)
    loop = asyncio.get_running_loop()

    async def timed() -> tuple[BaseException | None, float]:
        began = loop.time()
        try:
            await client.get("{t}k")
        except OUTAGE as exc:
            return exc, loop.time() - began
        return None, loop.time() - began

    try:
        assert await client.set("{t}k", b"v")
        master = redis_cluster.master_of("{t}k")
        # Stopped until every call has given up: well under the node timeout (1 s) unless
        # the calls waited as long as the ones ahead of them.
        master.popen.send_signal(signal.SIGSTOP)
        try:
            async with asyncio.timeout(10):
                ended = await asyncio.gather(*(timed() for _ in range(CALLS)))
        finally:
            master.popen.send_signal(signal.SIGCONT)
        assert all(exc is not None for exc, _ in ended), ended
        refused = [took for exc, took in ended if isinstance(exc, MaxConnectionsError)]
        assert refused
        assert min(took for _, took in ended) >= timeout_s / 2, ended
    finally:
        await client.aclose()


async def test_cluster_callers_that_give_up_waiting_leak_no_connection(
    redis_cluster: RedisClusterProcs,
) -> None:
    """Callers that give up while their calls wait for a connection (all but the bound's,
    here) take nothing with them: afterwards a full bound of calls is in flight at once again
    (not one fewer for each slot a cancelled wait kept), and the calls past it wait."""
    client = open_redis(redis_cluster.url, timeout_s=2.0, max_connections=CAP, cluster=True)
    assert isinstance(client, RedisCluster)
    try:
        assert await client.set("{t}k", b"v")
        master = redis_cluster.master_of("{t}k")
        node = client.get_node("127.0.0.1", master.port)
        assert node is not None
        master.popen.send_signal(signal.SIGSTOP)
        try:
            await stalled_calls(lambda: client.get("{t}k"))
        finally:
            master.popen.send_signal(signal.SIGCONT)
        await client.calls.settle()  # type: ignore[attr-defined]
        await idle(client)

        master.popen.send_signal(signal.SIGSTOP)
        try:
            answering = asyncio.gather(
                *(client.get("{t}k") for _ in range(2 * CAP)), return_exceptions=True
            )
            in_use = 0
            for _ in range(100):
                await asyncio.sleep(0.01)
                in_use = len(node._connections) - len(node._free)
                if in_use == CAP:
                    break
        finally:
            master.popen.send_signal(signal.SIGCONT)
        async with asyncio.timeout(10):
            answers = await answering
        assert in_use == CAP
        assert answers == [b"v"] * (2 * CAP)
        assert len(node._connections) == CAP
    finally:
        await client.aclose()
