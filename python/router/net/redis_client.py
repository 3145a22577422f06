"""One way to open Redis for the shared state: a single server or a Cluster, TLS and password."""

from __future__ import annotations

import contextlib
from typing import Any, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
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


def open_redis(url: str, *, timeout_s: float, cluster: bool = False) -> Client:
    """A client for `url` (redis://, rediss://, unix://; password and TLS options in the URL).

    No client-side retries: a slow or absent Redis must cost one short timeout, not several.
    With `cluster`, `url` names any one node; the client learns the others and follows failovers.
    A new connection sends nothing before the first command (db 0, no password: a password
    adds AUTH, a database other than 0 adds SELECT, one round trip each).
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
    if cluster:
        # A master killed: its slots answer MOVED/connection errors until the replica takes
        # over; the cluster client refreshes its slot map, the caller sees an outage meanwhile.
        return RedisCluster.from_url(url, **common)
    return aioredis.Redis.from_url(url, retry_on_timeout=False, **common)


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
