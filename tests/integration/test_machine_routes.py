"""The client listener's operator routes under `--workers N` without an admin listener, in
process over a real Unix socket to a stand-in supervisor: /admin/* without the admin token is
refused before anything is passed on, and only MACHINE_IN_FLIGHT requests are passed at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from router.access.auth import Authenticator, hash_key
from router.config import loads
from router.server.app import error_middleware
from router.server.machine import MACHINE_IN_FLIGHT, add_machine_routes

ADMIN = "admin-machine-0123456789"
TENANT = "sk-tenant-machine-0123456789"


class Supervisor:
    """Answers on a Unix socket; holds every request until `release` is set."""

    def __init__(self) -> None:
        self.asked = 0
        self.holding = 0
        self.all_held = asyncio.Event()
        self.release = asyncio.Event()

    async def answer(self, request: web.Request) -> web.Response:
        self.asked += 1
        self.holding += 1
        if self.holding == MACHINE_IN_FLIGHT:
            self.all_held.set()
        await self.release.wait()
        self.holding -= 1
        return web.json_response({"path": request.path})


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[tuple[str, Supervisor]]:
    supervisor = Supervisor()
    machine = web.Application()
    machine.router.add_route("*", "/{tail:.*}", supervisor.answer)
    runner = web.AppRunner(machine)
    await runner.setup()
    sock = str(tmp_path / "machine.sock")
    await web.UnixSite(runner, sock).start()
    config = loads(
        f'[auth]\nadmin_token_sha256 = "{hash_key(ADMIN)}"\n'
        f'[[auth.keys]]\nsha256 = "{hash_key(TENANT)}"\ntenant = "t"\n'
        '[[regions]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodels = ["m"]\n',
        "machine.toml",
    )
    app = web.Application(middlewares=[error_middleware()])
    add_machine_routes(app, sock, Authenticator.from_config(config.auth).check_admin, 1.0)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")), supervisor
    supervisor.release.set()
    await server.close()
    await runner.cleanup()


@pytest.mark.parametrize(("key", "status"), [(None, 401), (TENANT, 403), ("wrong", 401)])
async def test_admin_without_the_token_is_refused_before_anything_is_passed_on(
    worker: tuple[str, Supervisor], key: str | None, status: int
) -> None:
    url, supervisor = worker
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/admin/regions/a/drain", data=b"x" * 1000, headers=headers) as resp,
    ):
        assert resp.status == status
        error = (await resp.json())["error"]
    assert error["type"] in ("invalid_request_error", "authentication_error", "permission_error")
    assert supervisor.asked == 0


async def test_operator_requests_passed_on_at_once_are_bounded(
    worker: tuple[str, Supervisor],
) -> None:
    url, supervisor = worker
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as session:

        async def get(path: str, headers: dict[str, str] | None = None) -> int:
            async with session.get(url + path, headers=headers) as resp:
                await resp.read()
                return resp.status

        held = [
            asyncio.create_task(get("/metrics" if i % 2 else "/admin/health", admin))
            for i in range(MACHINE_IN_FLIGHT)
        ]
        await supervisor.all_held.wait()
        # Every slot taken: the next is refused at once, in OpenAI's shape, and not passed on.
        async with session.get(url + "/status.json") as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            assert (await resp.json())["error"]["code"] == "operator_requests_busy"
        assert supervisor.asked == MACHINE_IN_FLIGHT
        supervisor.release.set()
        assert await asyncio.gather(*held) == [200] * MACHINE_IN_FLIGHT
        # The slots are free again.
        assert await get("/metrics") == 200


async def test_clients_sending_bodies_slowly_hold_no_slot(worker: tuple[str, Supervisor]) -> None:
    url, supervisor = worker
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    # More unauthenticated clients than slots, each promising a body it never sends.
    stalled = []
    for _ in range(MACHINE_IN_FLIGHT * 3):
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        stalled.append(writer)
    await asyncio.sleep(0.2)
    try:
        supervisor.release.set()
        async with aiohttp.ClientSession() as session:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            async with session.get(url + "/admin/health", headers=admin) as resp:
                assert resp.status == 200
    finally:
        for writer in stalled:
            writer.close()
