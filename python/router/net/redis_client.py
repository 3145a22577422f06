"""One way to open Redis for the shared state: a single server or a Cluster, TLS and password."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout
from redis.maint_notifications import MaintNotificationsConfig

# Failures that mean "Redis is not answering", as opposed to a bug in our call.
OUTAGE: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
# The outages that mean "no answer in time" (ours or the socket's), not a refusal.
TIMEOUTS: tuple[type[BaseException], ...] = (TimeoutError, RedisTimeout)

Client: TypeAlias = "aioredis.Redis | RedisCluster"

# Handshakes going on after their caller gave up (kept referenced until they end).
_HANDSHAKES: set[asyncio.Task[None]] = set()


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
            connecting = super().connect_check_health(check_health, retry_socket_connect)
            task = self._connecting = asyncio.ensure_future(connecting)
            _HANDSHAKES.add(task)
            task.add_done_callback(_handshake_ended)
        await asyncio.shield(task)

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


def _connection_class(url: str) -> type[Connection]:
    """The connection class for a redis:// or rediss:// URL (unix:// has its own)."""
    return _TlsConnection if url.partition("://")[0].lower() == "rediss" else _TcpConnection


def open_redis(url: str, *, timeout_s: float, cluster: bool = False) -> Client:
    """A client for `url` (redis://, rediss://, unix://; password and TLS options in the URL).

    No client-side retries: a slow or absent Redis must cost one short timeout, not several.
    With `cluster`, `url` names any one node; the client learns the others and follows failovers.
    A new connection sends nothing before the first command (db 0, no password: a password
    adds AUTH, a database other than 0 adds SELECT, one round trip each), and its handshake
    outlives a caller that gives up on it (`_Handshake`).
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
    }
    connection_class = _connection_class(url)
    if cluster:
        # A master killed: its slots answer MOVED/connection errors until the replica takes
        # over; the cluster client refreshes its slot map, the caller sees an outage meanwhile.
        client = RedisCluster.from_url(url, **common)
        # Its nodes (those known now, and those it learns) connect the same way.
        manager = client.nodes_manager
        manager.connection_kwargs["connection_class"] = connection_class
        for node in manager.startup_nodes.values():
            node.connection_class = connection_class
        return client
    unix = url.partition("://")[0].lower() == "unix"
    return aioredis.Redis.from_url(
        url,
        retry_on_timeout=False,
        connection_class=_UnixConnection if unix else connection_class,
        **common,
    )


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
    if isinstance(client, RedisCluster):
        with contextlib.suppress(*OUTAGE):
            await client.nodes_manager.initialize()
