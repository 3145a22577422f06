"""`router serve --workers N`: one supervisor, N worker processes sharing the listeners.

Each worker is `router serve` itself, binding the client listener with SO_REUSEPORT so the kernel
spreads connections over them. The supervisor restarts a worker that dies (giving back the
limit and admission slots it held), checks a reload once and then has every worker apply it (so
all reach the same generation), and on SIGTERM has every worker drain. Workers load its
snapshot of the config it last accepted (server.snapshot), never the operator's file: a
restarted worker runs its siblings' config whatever the file says by then. It runs the machine's
one health prober (routing.machine_prober). It answers for the machine: /metrics and
/status.json merged from every worker (each answers on a private Unix socket), /admin/reload for
all, other /admin/* calls passed to every worker once the admin token checks out; on
`admin_listen` when that is set, and on a private socket the workers pass the client listener's
operator routes to when it is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from router.access import shared_buckets
from router.access.auth import Authenticator
from router.config import Config, loads, parse_listen, read
from router.core.admin import json_response
from router.errors import ConfigError, InvalidRequest, StartupError
from router.observability.merge import merge_metrics, merge_status, monotonic_only
from router.routing import shared_pins
from router.routing.admin import admin_change
from router.routing.machine_prober import MachineProber
from router.server import http_errors, snapshot
from router.server.app import error_middleware
from router.server.machine import MachineDir
from router.server.machine_reload import supervisor_reloader
from router.server.reload import LiveConfig
from router.server.run import listen_error
from router.server.tls import Listeners

log = logging.getLogger("router")

# A worker that dies sooner than this after starting counts towards a crash loop.
_QUICK_DEATH_S = 5.0
# This many quick deaths in a row stop the supervisor: restarting would only spin.
_CRASH_LOOP = 5


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class _Slot:
    """One worker position: its current process and its history."""

    index: int
    socket: str
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    quick_deaths: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Supervisor:
    """Starts, restarts, reloads and stops the workers."""

    def __init__(self, config: Config, path: Path, count: int, text: str) -> None:
        """`text`: the file's text `config` was decoded from (what the workers load)."""
        self.path = path
        self.count = count
        self.stopping = False
        self.failed: str | None = None
        # Private (0700): only this user's processes reach the tables and sockets in it.
        self.dir = MachineDir(tempfile.mkdtemp(prefix="router-workers-"))
        self.slots = [_Slot(i, self.dir.ops_socket(i)) for i in range(count)]
        self.live = LiveConfig(config, path)
        snapshot.write(self.dir.config, text, self.generation)
        self.auth = Authenticator.from_config(config.auth)
        self.listeners = Listeners(config)
        # Rate-limit buckets, in-flight and admission counts every worker maps (exact across
        # workers).
        shared_buckets.create(self.dir.limits)
        # Which region holds each stored Responses API response, noted by any worker.
        shared_pins.create(self.dir.pins, max(1024, config.state.max_responses))
        # The one prober of the machine; the workers route from what it publishes.
        self.prober = MachineProber(
            config.health, config.regions, self.dir.health_table, self.dir.health_reports
        )
        self.reloader = supervisor_reloader(
            self.live, self.auth, self.prober.health, self.listeners
        )
        self._done = asyncio.Event()
        # Each slot's last /metrics (its process's pid, the text), and the counters of the
        # processes that died since start: the machine's counters never go down.
        self._last_metrics: dict[int, tuple[int, str]] = {}
        self._retired_metrics = ""

    @property
    def config(self) -> Config:
        """The config the workers run (the last one accepted)."""
        return self.live.config

    @property
    def generation(self) -> int:
        return self.live.generation

    # ---- workers ----

    async def _spawn(self, slot: _Slot) -> None:
        args = [
            sys.executable,
            "-m",
            "router",
            "serve",
            "--config",
            self.dir.config,
            "--worker",
            f"{slot.index}:{self.generation}:{os.getpid()}",
            "--machine-dir",
            self.dir.path,
        ]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(slot.socket)
        slot.proc = await asyncio.create_subprocess_exec(*args)
        slot.started = time.monotonic()

    async def _watch(self, slot: _Slot) -> None:
        """Keep this slot's worker running until the supervisor stops."""
        while True:
            await self._spawn(slot)
            assert slot.proc is not None
            code = await slot.proc.wait()
            # What it held (max_concurrent and admission slots) is free again at once, not
            # only when its successor starts.
            shared_buckets.forget_worker(self.dir.limits, slot.index)
            if self.stopping:
                return
            lived = time.monotonic() - slot.started
            slot.quick_deaths = slot.quick_deaths + 1 if lived < _QUICK_DEATH_S else 0
            if slot.quick_deaths >= _CRASH_LOOP:
                self.failed = (
                    f"worker {slot.index} exited {slot.quick_deaths} times within "
                    f"{_QUICK_DEATH_S:g}s of starting (last exit code {code}); giving up"
                )
                self._done.set()
                return
            slot.restarts += 1
            log.warning(
                "worker %d (pid %d) exited with code %s; restarting it",
                slot.index,
                slot.proc.pid,
                code,
            )
            if slot.quick_deaths:
                await asyncio.sleep(min(2.0, 0.1 * 2**slot.quick_deaths))

    def alive(self) -> list[_Slot]:
        """Slots whose worker is running."""
        return [s for s in self.slots if s.proc is not None and s.proc.returncode is None]

    def signal_all(self, sig: int) -> None:
        for slot in self.alive():
            assert slot.proc is not None
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(sig)

    def _signal_ready(self, sig: int) -> None:
        """`sig` to the workers that can take it: a starting worker (no ops socket yet, made
        after its SIGHUP handler) would die of it; it reads the snapshot once ready instead."""
        for slot in self.alive():
            assert slot.proc is not None
            if os.path.exists(slot.socket):
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(sig)

    # ---- reload ----

    def reload(self) -> tuple[bool, str]:
        """Check the file once, refusing what any worker would, then snapshot it and have every
        worker apply it: all reach one generation. All or nothing; never raises."""
        try:
            text = read(self.path)
            new = loads(text, str(self.path), os.environ)
            commits = self.reloader.prepare(new, str(self.path))
            # Before anything commits: a snapshot that cannot be written changes nothing.
            snapshot.write(self.dir.config, text, self.generation + 1)
        except ConfigError as exc:
            return self._rejected(str(exc))
        except Exception as exc:
            log.exception("config reload: unexpected error")
            return self._rejected(f"{self.path}: internal error: {exc!r}")
        self.reloader.commit(commits)
        self.live.config = new
        self.live.generation += 1
        # After the snapshot: a worker not signalled (still starting) reads it once ready.
        self._signal_ready(signal.SIGHUP)
        message = (
            f"config reloaded from {self.path} by {len(self.alive())} workers "
            f"(generation {self.generation})"
        )
        log.info("%s", message)
        return True, message

    def _rejected(self, reason: str) -> tuple[bool, str]:
        message = f"config reload rejected, workers stay at generation {self.generation}: {reason}"
        log.error("%s", message)
        return False, message

    # ---- lifetime ----

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        # Probing (and the first published image) before any worker routes.
        await self.prober.start()
        for slot in self.slots:
            slot.task = asyncio.create_task(self._watch(slot))
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._done.set)
        admin = await self._admin_listener()
        log.info(
            "supervisor pid %d: %d workers on %s",
            os.getpid(),
            self.count,
            self.config.server.listen,
        )
        try:
            await self._done.wait()
        finally:
            self.stopping = True
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            log.info("stop signal: draining %d workers", len(self.alive()))
            self.signal_all(signal.SIGTERM)
            await self._reap()
            await admin.cleanup()
            await self.prober.close()
            shutil.rmtree(self.dir.path, ignore_errors=True)
        if self.failed is not None:
            log.error("%s", self.failed)
            return 1
        return 0

    async def _reap(self) -> None:
        grace = self.config.server.drain_timeout_s + 5.0
        tasks = [s.task for s in self.slots if s.task is not None]
        _, pending = await asyncio.wait(tasks, timeout=grace) if tasks else (set(), set())
        if pending:
            log.warning("%d workers still running after %gs: killing them", len(pending), grace)
            self.signal_all(signal.SIGKILL)
            await asyncio.wait(pending, timeout=5.0)

    # ---- the machine's admin listener ----

    async def _admin_listener(self) -> web.AppRunner:
        """The machine's operator routes: on the private socket the workers pass the client
        listener's to, and on admin_listen when set."""
        listen = self.config.server.admin_listen
        http_errors.install()
        # Errors (aiohttp's 404/405/413 included) in OpenAI's shape, as the workers answer them.
        app = web.Application(middlewares=[error_middleware()])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status.json", self._status_json)
        app.router.add_get("/status", self._passed_to_one)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._passed_to_one)
        app.router.add_post("/admin/reload", self._reload)
        app.router.add_route("*", "/admin/{tail:.*}", self._passed_to_all)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, self.dir.socket).start()
        if listen is None:
            return runner
        host, port = parse_listen(listen)
        ssl_context = self.listeners.admin
        try:
            await web.TCPSite(
                runner, host, port, reuse_address=True, ssl_context=ssl_context
            ).start()
        except OSError as exc:
            self.failed = str(listen_error(listen, "admin_listen", exc))
            self._done.set()
        return runner

    async def _ask(
        self, slot: _Slot, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, str]:
        connector = aiohttp.UnixConnector(path=slot.socket)
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            session.request(
                method, f"http://worker{path}", headers=headers, data=body or None
            ) as resp,
        ):
            return resp.status, await resp.read(), resp.headers.get("Content-Type", "")

    async def _gather(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> list[tuple[int, bytes, str]]:
        results = await asyncio.gather(
            *(self._ask(s, method, path, headers or {}, body) for s in self.alive()),
            return_exceptions=True,
        )
        return [r for r in results if not isinstance(r, BaseException)]

    async def _metrics(self, request: web.Request) -> web.Response:
        """Every worker's figures summed; a worker that died (or did not answer) counts with
        the counters it had last, so no sum goes down when one is restarted."""
        alive = {s.index: s for s in self.alive()}
        answers = await asyncio.gather(
            *(self._ask(s, "GET", "/metrics", {}, b"") for s in alive.values()),
            return_exceptions=True,
        )
        texts: list[str] = []
        answered: set[int] = set()
        for slot, answer in zip(alive.values(), answers, strict=True):
            if isinstance(answer, BaseException) or answer[0] != 200:
                continue
            assert slot.proc is not None
            last = self._last_metrics.get(slot.index)
            if last is not None and last[0] != slot.proc.pid:
                # Its predecessor died: what it counted stays counted.
                retired = merge_metrics([self._retired_metrics, monotonic_only(last[1])])
                self._retired_metrics = retired
            text = answer[1].decode()
            self._last_metrics[slot.index] = (slot.proc.pid, text)
            texts.append(text)
            answered.add(slot.index)
        texts += [
            monotonic_only(text) for i, (_, text) in self._last_metrics.items() if i not in answered
        ]
        texts.append(self._retired_metrics)
        own = generate_latest(_own_registry(self)).decode()
        return web.Response(
            text=merge_metrics(texts, own), content_type="text/plain", charset="utf-8"
        )

    async def _status_json(self, request: web.Request) -> web.Response:
        answers = await self._gather("GET", "/status.json")
        feeds = [msgspec.json.decode(body) for status, body, _ in answers if status == 200]
        merged = merge_status(feeds, len(self.alive()))
        return web.Response(
            body=msgspec.json.encode(merged),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def _passed_to_one(self, request: web.Request) -> web.Response:
        for slot in self.alive():
            with contextlib.suppress(OSError, aiohttp.ClientError, asyncio.TimeoutError):
                status, body, ctype = await self._ask(
                    slot, "GET", request.path_qs, dict(request.headers), b""
                )
                return _answer(status, body, ctype)
        return json_response({"status": "no worker running"}, status=503)

    async def _passed_to_all(self, request: web.Request) -> web.Response:
        """An admin call every worker must apply (drain a region, set weights...); the first
        worker's answer is returned, with how many workers applied it. Without the admin token
        it is refused here, before its body is read or any worker is asked."""
        self.auth.check_admin(request.headers)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        answers = await self._gather(request.method, request.path_qs, headers, body)
        if not answers:
            return json_response({"status": "no worker answered"}, status=503)
        status, first, ctype = answers[0]
        change = admin_change(request.method, request.path)
        if change is not None and status == 200:
            self.prober.set_admin(*change)
        response = _answer(status, first, ctype)
        response.headers["X-Router-Workers"] = f"{len(answers)}/{self.count}"
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        if not self.alive():
            return json_response({"status": "no worker running"}, status=503)
        return json_response({"status": "ok", "workers": len(self.alive())})

    async def _reload(self, request: web.Request) -> web.Response:
        self.auth.check_admin(request.headers)
        applied, message = self.reload()
        if not applied:
            raise InvalidRequest(message, code="invalid_config")
        return json_response(
            {"status": "applied", "generation": self.generation, "message": message}
        )


def _answer(status: int, body: bytes, content_type: str) -> web.Response:
    media, _, params = content_type.partition(";")
    charset = params.partition("charset=")[2].strip() or None
    return web.Response(
        status=status, body=body, content_type=media.strip() or None, charset=charset
    )


class _SupervisorCollector(Collector):
    def __init__(self, supervisor: Supervisor) -> None:
        self._s = supervisor

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        s = self._s
        restarts = CounterMetricFamily(
            "router_worker_restarts",
            "Workers restarted after they died.",
            value=sum(x.restarts for x in s.slots),
        )
        alive = GaugeMetricFamily(
            "router_workers", "Worker processes running.", value=len(s.alive())
        )
        return [restarts, alive]


def _own_registry(supervisor: Supervisor) -> CollectorRegistry:
    """The supervisor's own process figures (summed with the workers') and worker counts."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    registry.register(_SupervisorCollector(supervisor))
    return registry


def _preflight(config: Config, path: Path) -> None:
    """What would make every worker fail at once, as one line before any starts."""
    try:
        Listeners(config)
    except ConfigError as exc:
        raise StartupError(f"{path}: {exc}") from None
    listen = config.server.listen
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        probe.bind((host, port))
    except OSError as exc:
        raise listen_error(listen, "listen", exc) from None
    finally:
        probe.close()


def supervise(config: Config, path: Path, count: int, text: str) -> int:
    """Blocking entry point of `router serve --workers N` (N > 1): the exit code. `text`: the
    file's text `config` was decoded from."""
    _preflight(config, path)
    if config.server.listen.rpartition(":")[2] == "0":
        raise StartupError(f"{path}: field `server.listen`: workers need a fixed port, not 0")
    return uvloop.run(Supervisor(config, path, count, text).run())
