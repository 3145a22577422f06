"""What the workers of one machine share: the files in the supervisor's private directory, a
worker's handles on them, and the client listener's operator routes answered for the machine.

    config.toml     the config the supervisor last accepted, which every worker loads (snapshot)
    limits.table    rate-limit buckets, `max_concurrent` and admission counts (shared_buckets)
    health.table    region health from the one prober (routing.shared_health)
    health.sock     the workers' passive reports to that prober
    pins.table      which region holds each stored Responses API response (routing.shared_pins)
    machine.sock    the supervisor's machine view: /metrics, /status*, /admin/* for every worker
    w<N>.sock       worker N's own operator routes, which the supervisor asks and merges
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from router.access.shared_buckets import SharedBucketTable
from router.core.admin import Guard
from router.core.request import read_body
from router.errors import Unavailable
from router.routing.shared_health import SharedHealth
from router.routing.shared_pins import SharedPins

# Client-listener paths that answer for the machine when there is no admin listener.
MACHINE_PATHS = ("/metrics", "/status", "/status.json")
# Headers the answering worker sets itself.
_HOP = frozenset({"content-length", "transfer-encoding", "connection", "server", "date"})
_SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("router.machine.session")


@dataclass(frozen=True, slots=True)
class MachineDir:
    """The supervisor's private directory and the names in it."""

    path: str

    @property
    def config(self) -> str:
        return os.path.join(self.path, "config.toml")

    @property
    def limits(self) -> str:
        return os.path.join(self.path, "limits.table")

    @property
    def health_table(self) -> str:
        return os.path.join(self.path, "health.table")

    @property
    def pins(self) -> str:
        return os.path.join(self.path, "pins.table")

    @property
    def health_reports(self) -> str:
        return os.path.join(self.path, "health.sock")

    @property
    def socket(self) -> str:
        return os.path.join(self.path, "machine.sock")

    def ops_socket(self, index: int) -> str:
        return os.path.join(self.path, f"w{index}.sock")


@dataclass(slots=True)
class Machine:
    """A worker's handles on what its machine shares."""

    limits: SharedBucketTable
    health: SharedHealth
    socket: str
    pins: SharedPins | None = None

    @classmethod
    def open(cls, directory: MachineDir, worker: int, regions: list[str] | None = None) -> Machine:
        pins = None
        if regions is not None and os.path.exists(directory.pins):
            pins = SharedPins(directory.pins, regions)
        return cls(
            SharedBucketTable(directory.limits, worker),
            SharedHealth(directory.health_table, directory.health_reports),
            directory.socket,
            pins,
        )

    def close(self) -> None:
        if self.pins is not None:
            self.pins.close()
        self.health.close()
        self.limits.close()


# Operator requests one worker passes to the supervisor at once (each is answered by every
# worker: a flood would multiply); more are refused with a 503 at once, never queued.
MACHINE_IN_FLIGHT = 4
# The supervisor's own limit on what it is asked (its listener's aiohttp default, 1 MiB).
MACHINE_MAX_BODY = 1 << 20


def add_machine_routes(
    app: web.Application, socket: str, guard: Guard, body_timeout_s: float
) -> None:
    """The client listener's /metrics, /status* and /admin/* (no admin listener), answered by
    the supervisor for the whole machine instead of by whichever worker took the connection.

    An /admin/* call without the admin token is refused here (`guard`), before its body is read
    or anything is passed on; at most MACHINE_IN_FLIGHT calls are passed on at once, each
    counted once its body is in (read within `body_timeout_s`, at most MACHINE_MAX_BODY
    bytes), so a client sending a body slowly holds no slot."""
    passing = 0

    async def session(app: web.Application) -> AsyncIterator[None]:
        app[_SESSION] = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket),
            timeout=aiohttp.ClientTimeout(total=10.0),
            auto_decompress=False,
        )
        yield
        await app[_SESSION].close()

    async def ask(request: web.Request) -> web.Response:
        nonlocal passing
        if request.path.startswith("/admin/"):
            guard(request.headers)
        body = await read_body(request, MACHINE_MAX_BODY, body_timeout_s)
        if passing >= MACHINE_IN_FLIGHT:
            raise Unavailable(
                f"Too many operator requests in flight on this worker (limit "
                f"{MACHINE_IN_FLIGHT}); retry, or use [server] admin_listen.",
                code="operator_requests_busy",
                headers={"Retry-After": "1"},
            )
        passing += 1
        try:
            return await _pass(app[_SESSION], request, body)
        finally:
            passing -= 1

    app.cleanup_ctx.append(session)
    for path in MACHINE_PATHS:
        app.router.add_get(path, ask)
    app.router.add_route("*", "/admin/{tail:.*}", ask)


async def _pass(session: aiohttp.ClientSession, request: web.Request, body: bytes) -> web.Response:
    """`request` (its `body` read) asked of the supervisor; its answer as the client's."""
    headers = {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in ("host", "connection", "content-length", "transfer-encoding")
    }
    async with session.request(
        request.method, f"http://machine{request.path_qs}", headers=headers, data=body or None
    ) as resp:
        passed = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        return web.Response(status=resp.status, body=await resp.read(), headers=passed)
