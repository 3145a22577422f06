"""One way to open Redis for the shared state: a single server or a Cluster, TLS and password."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from contextvars import ContextVar
from functools import partial
from typing import Any, TypeAlias, TypeVar, cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    BlockingConnectionPool,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import MaxConnectionsError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout
from redis.maint_notifications import MaintNotificationsConfig

# Failures that mean "Redis is not answering", as opposed to a bug in our call.
OUTAGE: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
# The outages that mean "no answer in time" (ours or the socket's), not a refusal.
TIMEOUTS: tuple[type[BaseException], ...] = (TimeoutError, RedisTimeout)

Client: TypeAlias = "aioredis.Redis | RedisCluster"

# Connections one client keeps to a Redis (to each node of a Cluster) at most, unless told.
MAX_CONNECTIONS = 64

T = TypeVar("T")

# Handshakes going on after their caller gave up (kept referenced until they end).
_HANDSHAKES: set[asyncio.Task[None]] = set()


class _Sent:
    """Whether the call a command task runs has put a command on the wire yet."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


# The command task the current code runs in (None outside one, and in a handshake).
_CALL: ContextVar[_Sent | None] = ContextVar("redis_call", default=None)


class _Handshake(AbstractConnection):
    """A connection whose connect (socket, TLS, AUTH/SELECT) goes on to its end when the call
    that started it gives up (the caller's timeout, shorter than the handshake plus its command
    for a far Redis): the connection is then ready for the next call, instead of thrown away
    and started cold again by each call, which never got past the handshake. It is bounded by
    the socket's own timeouts; closing the connection stops it."""

    _connecting: asyncio.Task[None] | None = None

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        # Where every connect goes: `connect()` (the single-server pool) and a cluster node's
        # `send_packed_command` alike.
        task = self._connecting
        if task is None or task.done():
            if self.is_connected:
                return
            connecting = self._handshake(check_health, retry_socket_connect)
            task = self._connecting = asyncio.ensure_future(connecting)
            _HANDSHAKES.add(task)
            task.add_done_callback(_handshake_ended)
        await asyncio.shield(task)

    async def _handshake(self, check_health: bool, retry_socket_connect: bool) -> None:
        # Its AUTH and SELECT are not the command of the call that started it (_Sent).
        _CALL.set(None)
        await super().connect_check_health(check_health, retry_socket_connect)

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        # Every command goes out here (a cluster node's, a pipeline's batch alike); from the
        # write on, the call's reply is owed on this connection (_Calls).
        if not self.is_connected:
            await self.connect_check_health(check_health=False)
        call = _CALL.get()
        if call is not None:
            call.sent = True
        await super().send_packed_command(command, check_health)

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:
        task = self._connecting
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        await super().disconnect(*args, **kwargs)


def _handshake_ended(task: asyncio.Task[None]) -> None:
    _HANDSHAKES.discard(task)
    if not task.cancelled():
        task.exception()  # seen by whoever still waits; never "never retrieved"


class _TcpConnection(_Handshake, Connection):
    pass


class _TlsConnection(_Handshake, SSLConnection):
    pass


class _UnixConnection(_Handshake, UnixDomainSocketConnection):
    pass


class _Calls:
    """The calls of one client (a command, a pipeline, a transaction) whose callers gave up
    once the command was sent (the caller's timeout, shorter than a far Redis's round trip):
    each goes on in its task to its reply, read and dropped (bounded by the socket timeout),
    and its connection goes back to the pool ready. Cancelled mid-reply, redis-py closes the
    connection (the reply stream's place is lost), and the next call pays a new connect. A call
    given up before its command went out is cancelled, as before: nothing is sent for it.

    With a `bound` (a Cluster's: its nodes have no waiting pool), at most that many calls are
    in flight at once; the next waits for one to end, at most `wait_s`, then fails as a single
    server's pool does when none comes back (MaxConnectionsError, a ConnectionError). A call
    holds its slot from before its command goes out to its task's end, however its caller
    leaves."""

    def __init__(self, bound: int | None = None, wait_s: float = 0.0) -> None:
        self._left: set[asyncio.Task[Any]] = set()
        self.bound = bound
        self.wait_s = wait_s
        self._slots = None if bound is None else asyncio.Semaphore(bound)

    async def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """The answer of the call `make()` starts; the caller's cancellation reaches it only
        before its command is sent. The call is made only once it may run (a call cancelled or
        refused before that leaves no coroutine never awaited)."""
        if _CALL.get() is not None:
            return await make()  # inside a call already (a Cluster's multi-slot command)
        sent = _Sent()
        task = asyncio.ensure_future(_run(sent, make, self._slots, self.wait_s))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not sent.sent:
                task.cancel()
            self._left.add(task)
            task.add_done_callback(self._ended)
            raise

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._left.discard(task)
        if not task.cancelled():
            task.exception()  # the caller is gone: a late error is nobody's

    async def settle(self) -> None:
        """Wait for the calls left going to end."""
        while self._left:
            await asyncio.wait(tuple(self._left))

    async def aclose(self) -> None:
        """Stop the calls left going (their connections close with the client)."""
        for task in self._left:
            task.cancel()
        await self.settle()


async def _run(
    sent: _Sent,
    make: Callable[[], Coroutine[Any, Any, T]],
    slots: asyncio.Semaphore | None,
    wait_s: float,
) -> T:
    _CALL.set(sent)  # this task's own context: what it sends marks `sent`
    if slots is None:
        return await make()
    # The slot is taken in the call's own task: a caller leaving cancels the wait (the
    # semaphore gives back a slot it handed over meanwhile), and once taken it is given back
    # when the call ends, once, whether it ran to its reply or was cancelled before sending.
    try:
        async with asyncio.timeout(wait_s):
            await slots.acquire()
    except TimeoutError:
        raise MaxConnectionsError("No connection available.") from None  # nothing was sent
    try:
        return await make()
    finally:
        slots.release()


class _Redis(aioredis.Redis):
    """A single server's client whose calls outlive callers that gave up once sent (_Calls)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = _Calls()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        call = partial(super().execute_command, *args, **options)
        return await self.calls.run(call)

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        pipe = _Pipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.calls = self.calls
        return pipe

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await self.calls.aclose()
        await super().aclose(close_connection_pool)


class _OwnedPipeline:
    """A pipeline (or MULTI/EXEC transaction) whose execute() is one call of _Calls; the
    execute a caller left goes on with the commands it holds, so only it resets the pipeline."""

    calls: _Calls
    _owner: _Sent | None = None

    async def _owned(self, execute: Callable[[], Coroutine[Any, Any, list[Any]]]) -> list[Any]:
        self._owner = _CALL.get()
        try:
            return await execute()
        finally:
            self._owner = None

    async def reset(self) -> None:
        # A caller that gave up (leaving `async with`) must not give the connection back while
        # the execute it left reads the replies; that execute resets the pipeline at its end.
        if self._owner is None or _CALL.get() is self._owner:
            await super().reset()  # type: ignore[misc]


class _Pipeline(_OwnedPipeline, Pipeline):  # type: ignore[misc]
    """A single server's pipeline (_OwnedPipeline)."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        execute = partial(super().execute, raise_on_error)
        return await self.calls.run(partial(self._owned, execute))


class _Cluster(RedisCluster):
    """A Cluster's client whose calls outlive callers that gave up once sent, and wait for a
    slot with the client's bound reached (_Calls; open_redis sets the bound)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = _Calls()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return await self.calls.run(partial(super().execute_command, *args, **kwargs))

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # raises: not in a Cluster
        # mypy takes a slot redis-py's ClusterPipeline never fills for an abstract attribute.
        pipe = _ClusterPipeline(self, transaction)  # type: ignore[abstract]
        pipe.calls = self.calls
        return pipe

    async def aclose(self) -> None:
        await self.calls.aclose()
        await super().aclose()


class _ClusterPipeline(_OwnedPipeline, ClusterPipeline):  # type: ignore[misc]
    """A Cluster's pipeline (_OwnedPipeline)."""

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        execute = partial(super().execute, raise_on_error, allow_redirections)
        return await self.calls.run(partial(self._owned, execute))


def _connection_class(url: str) -> type[Connection]:
    """The connection class for a redis:// or rediss:// URL (unix:// has its own)."""
    return _TlsConnection if url.partition("://")[0].lower() == "rediss" else _TcpConnection


def open_redis(
    url: str, *, timeout_s: float, max_connections: int = MAX_CONNECTIONS, cluster: bool = False
) -> Client:
    """A client for `url` (redis://, rediss://, unix://; password and TLS options in the URL).

    No client-side retries: a slow or absent Redis must cost one short timeout, not several.
    With `cluster`, `url` names any one node; the client learns the others and follows failovers.
    A new connection sends nothing before the first command (db 0, no password: a password
    adds AUTH, a database other than 0 adds SELECT, one round trip each), and its handshake
    outlives a caller that gives up on it (`_Handshake`); so does a call whose command was sent
    (`_Calls`).

    At most `max_connections` connections are open (to each node of a Cluster). A stalled
    Redis holds each until its reply or the socket timeout, so without a bound every call
    meanwhile opened one more (thousands under load: Redis's maxclients, the router's file
    descriptors). With all in use, a call opens none: it waits for one to come back, at most
    `timeout_s`, then fails (ConnectionError; a Cluster's MaxConnectionsError), an OUTAGE; its
    caller's own bound, as long, usually ends it first with the TimeoutError of a call Redis
    did not answer. redis-py's Cluster nodes have no waiting pool (past their bound a call
    fails at once: a burst to a far but healthy Cluster was an outage), so a Cluster's client
    waits before them: at most `max_connections` of its calls are in flight at once, to all
    its nodes together, and a call waits for a slot (`_Calls`). A burst to one node waits as
    for a single server; calls to other nodes wait behind it too.
    """
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        # Every exchange before the first command is a round trip a far Redis adds to each new
        # connection (and to the first call after an outage); a caller's timeout that covers
        # three of them cancels the handshake and the next call starts cold again. So RESP2
        # (RESP3 sends HELLO 3), no maintenance notifications (CLIENT MAINT_NOTIFICATIONS, a
        # RESP3 feature), no CLIENT SETINFO, no health-check PING.
        "protocol": 2,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
        "driver_info": None,
        # Per pool for a single server; per node in a Cluster (ClusterNode.acquire_connection,
        # which fails at once past it), where the client's calls wait for a slot first
        # (_Calls): a node reaches it only with every call of the client in flight there.
        "max_connections": max_connections,
    }
    connection_class = _connection_class(url)
    if cluster:
        # A master killed: its slots answer MOVED/connection errors until the replica takes
        # over; the cluster client refreshes its slot map, the caller sees an outage meanwhile.
        client = cast(_Cluster, _Cluster.from_url(url, **common))  # from_url builds `cls`
        # Its nodes fail at once past their bound: its calls wait for one of as many slots.
        client.calls = _Calls(bound=max_connections, wait_s=timeout_s)
        # Its nodes (those known now, and those it learns) connect the same way.
        manager = client.nodes_manager
        manager.connection_kwargs["connection_class"] = connection_class
        for node in manager.startup_nodes.values():
            node.connection_class = connection_class
        return client
    unix = url.partition("://")[0].lower() == "unix"
    pool = BlockingConnectionPool.from_url(
        url,
        timeout=timeout_s,
        retry_on_timeout=False,
        connection_class=_UnixConnection if unix else connection_class,
        **common,
    )
    return _Redis.from_pool(pool)


def key_fault(exc: BaseException) -> bool:
    """Whether a command's error is the key's own data at fault (a value of another type, a
    script that cannot read what it found), not Redis refusing work (OOM, READONLY, LOADING)."""
    return isinstance(exc, ResponseError) and str(exc).startswith(("WRONGTYPE", "ERR user_script:"))


def hash_tagged(prefix: str, key: str) -> str:
    """`prefix{key}`: Redis Cluster hashes only the braces, so every key of one tenant (or one
    cache entry) lives in one slot and a script touching it never crosses slots."""
    return f"{prefix}{{{key}}}"


async def ping(client: Client) -> None:
    """PING the server, or every master of a Cluster: a Cluster answers for all its slots only
    when each master does (after a failover, once the client has found the promoted replica)."""
    if isinstance(client, RedisCluster):
        try:
            await client.ping(target_nodes=RedisCluster.PRIMARIES)
        except OUTAGE:
            await refresh(client)
            raise
    else:
        await client.ping()


async def refresh(client: Client) -> None:
    """A Cluster client re-reads the slot map (a master failed, its replica took over); without
    client-side retries it would keep asking the dead master. No-op for a single server."""
    if isinstance(client, _Cluster):
        with contextlib.suppress(*OUTAGE):
            await client.calls.run(client.nodes_manager.initialize)
    elif isinstance(client, RedisCluster):
        with contextlib.suppress(*OUTAGE):
            await client.nodes_manager.initialize()
