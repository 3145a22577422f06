"""Running an aiohttp app on uvloop until SIGTERM/SIGINT, then draining in-flight requests."""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import uvloop
from aiohttp import web

from router.config import Config, parse_listen
from router.core.pipeline import Pipeline
from router.errors import ConfigError, StartupError
from router.server import gctune, parent
from router.server.app import ADMIN_APP, PIPELINE, STATE, build_app
from router.server.machine import Machine, MachineDir
from router.server.reload import RELOADER
from router.server.tls import Listeners

log = logging.getLogger("router")


# After a drain's deadline: time for the requests it ended to send their last bytes, and for
# aiohttp to wait on any other handler before cancelling it.
_AFTER_DRAIN_S = 2.0


def make_runner(app: web.Application, config: Config) -> web.AppRunner:
    """An AppRunner with the router's connection policy."""
    return web.AppRunner(
        app,
        handle_signals=False,
        # A client that goes away cancels its handler, which closes the upstream request.
        handler_cancellation=True,
        # aiohttp arms this at connect and after each response: a request head must arrive in time.
        keepalive_timeout=config.server.header_timeout_s,
        # What aiohttp waits for its handlers after the router's own drain (drain_after_stop)
        # ended the proxied requests; then it cancels whatever is left.
        shutdown_timeout=_AFTER_DRAIN_S,
        access_log=None,
        # Oversized request lines and headers get aiohttp's own 400 before any handler runs.
        max_line_size=config.server.max_header_bytes,
        max_field_size=config.server.max_header_bytes,
        max_headers=config.server.max_headers,
    )


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker process of `router serve --workers N`: which one, the config generation its
    siblings are at, and the supervisor's directory of what the machine shares."""

    index: int
    generation: int = 0
    # server.machine.MachineDir: limits table, health table and reports, sockets.
    machine_dir: str | None = None

    @property
    def ops_socket(self) -> str | None:
        """Where this worker's operator routes answer the supervisor."""
        if self.machine_dir is None:
            return None
        return MachineDir(self.machine_dir).ops_socket(self.index)


def listen_error(listen: str, what: str, exc: OSError) -> StartupError:
    """The one line an operator reads when `listen` cannot be bound."""
    reason = {
        errno.EADDRINUSE: "address already in use (another process listens there)",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
        errno.EADDRNOTAVAIL: "no such local address",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return StartupError(f"cannot listen on {listen} ({what}): {reason}")


async def start_site(
    runner: web.BaseRunner,
    listen: str,
    ssl_context: ssl.SSLContext | None = None,
    what: str = "listener",
    reuse_port: bool = False,
) -> str:
    """Listen on `listen` (`runner` set up); its URL, or StartupError naming the address.
    `reuse_port`: share the address with sibling workers (the kernel spreads connections)."""
    host, port = parse_listen(listen)
    site = web.TCPSite(
        runner,
        host,
        port,
        backlog=1024,
        reuse_address=True,
        reuse_port=reuse_port or None,
        ssl_context=ssl_context,
    )
    try:
        await site.start()
    except OSError as exc:
        raise listen_error(listen, what, exc) from None
    return f"{'https' if ssl_context is not None else 'http'}://{host}:{port}"


async def run_until_signal(
    runner: web.AppRunner,
    listen: str,
    on_ready: Callable[[str], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    extra: Callable[[], Awaitable[None]] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    stop: asyncio.Event | None = None,
    drain: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve on `listen` until SIGTERM/SIGINT (or until `stop`, which they set, is set by
    anything else); then `drain()` and `runner.cleanup()`, which waits for what is left."""
    await runner.setup()
    try:
        url = await start_site(runner, listen, ssl_context, "listen", reuse_port)
        if extra is not None:
            await extra()
    except BaseException:
        await runner.cleanup()
        raise
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_ready is not None:
        on_ready(url)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if on_stop is not None:
            on_stop()
        if drain is not None:
            await drain()
        # Closes the listening socket (if drain did not), then waits up to shutdown_timeout
        # for handlers.
        await runner.cleanup()


async def drain_after_stop(runner: web.AppRunner, pipeline: Pipeline, within_s: float) -> None:
    """Stop accepting and close idle connections, let the proxied requests in flight finish
    within `within_s`, then end those left (Pipeline.shut_down: a stream's failure event, a
    503 for one not answered yet) and give them a moment to send it."""
    for site in list(runner.sites):
        await site.stop()
    server = runner.server
    if server is not None:
        server.pre_shutdown()
        # That stops an idle connection's reading but leaves its socket open: a request sent
        # on it would wait out the drain unanswered. Closed now, its client goes elsewhere.
        for conn in server.connections:
            if not conn._request_in_progress:
                conn.force_close()
    if await pipeline.settle(within_s):
        ended = pipeline.shut_down()
        log.warning(
            "drain: %d requests still in flight after %gs ended (streams with an error event, "
            "the others with a 503)",
            ended,
            within_s,
        )
        await pipeline.settle(_AFTER_DRAIN_S)


async def serve_async(
    config: Config,
    on_ready: Callable[[str], None] | None = None,
    config_path: Path | None = None,
    worker: Worker | None = None,
) -> None:
    """Serve the router for `config` until a stop signal; SIGHUP reloads `config_path` (and the
    certificate files). StartupError when a listener or certificate cannot be set up."""
    source = config_path or "config"
    try:
        listeners = Listeners(config)
        machine = None
        if worker is not None and worker.machine_dir is not None:
            regions = [r.name for r in config.regions]
            machine = Machine.open(MachineDir(worker.machine_dir), worker.index, regions)
    except ConfigError as exc:
        raise StartupError(f"{source}: {exc}") from None
    try:
        app = build_app(
            config,
            config_path,
            worker.generation if worker is not None else 0,
            shared_stdout=worker is not None,
            machine=machine,
        )
    except ConfigError as exc:
        # A value the schema let through that a component refuses: a bad config, as at load.
        raise ConfigError(f"{source}: {exc}") from None
    app[RELOADER].register("tls", listeners.preparer(), ())
    runner = make_runner(app, config)
    admin_runner: web.AppRunner | None = None

    def draining() -> None:
        app[STATE].draining = True
        log.info(
            "stop signal: draining in-flight requests (up to %gs)", config.server.drain_timeout_s
        )

    async def started() -> None:
        nonlocal admin_runner
        # Startup hooks have run: what they built lives as long as the process.
        gctune.tune(config.server.gc_gen0_threshold)
        ops_socket = worker.ops_socket if worker is not None else None
        if config.server.admin_listen is None and ops_socket is None:
            return
        admin_runner = make_runner(app[ADMIN_APP], config)
        await admin_runner.setup()
        if ops_socket is not None:
            # The supervisor answers for the machine and asks each worker here. It sends SIGHUP
            # only once this socket exists (the handler is installed by then): a reload it
            # snapshotted before that is caught up with here.
            await web.UnixSite(admin_runner, ops_socket).start()
            app[RELOADER].reload()
            return
        assert config.server.admin_listen is not None
        url = await start_site(
            admin_runner, config.server.admin_listen, listeners.admin, "admin_listen"
        )
        log.info("admin listener on %s (/metrics, /status, /admin)", url)

    stop = asyncio.Event()
    if worker is not None:
        # The supervisor's death (when parent.follow tied the worker to it) stops it like a
        # SIGTERM would.
        loop = asyncio.get_running_loop()
        parent.on_gone(lambda: loop.call_soon_threadsafe(stop.set))
    try:
        await run_until_signal(
            runner,
            config.server.listen,
            on_ready,
            draining,
            started,
            listeners.client,
            reuse_port=worker is not None,
            stop=stop,
            drain=lambda: drain_after_stop(runner, app[PIPELINE], config.server.drain_timeout_s),
        )
    finally:
        if admin_runner is not None:
            await admin_runner.cleanup()
        if machine is not None:
            machine.close()


def serve(config: Config, config_path: Path | None = None, worker: Worker | None = None) -> None:
    """Blocking entry point of `router serve` (and of each worker of `--workers N`)."""

    def ready(url: str) -> None:
        if worker is None:
            log.info("router listening on %s", url)
        else:
            log.info("worker %d listening on %s", worker.index, url)

    uvloop.run(serve_async(config, ready, config_path, worker))
