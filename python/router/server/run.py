"""Running an aiohttp app on uvloop until SIGTERM/SIGINT, then draining in-flight requests."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop
from aiohttp import web

from router.config import Config, parse_listen
from router.server import gctune
from router.server.app import STATE, build_app

log = logging.getLogger("router")


def make_runner(app: web.Application, config: Config) -> web.AppRunner:
    """An AppRunner with the router's connection policy."""
    return web.AppRunner(
        app,
        handle_signals=False,
        # A client that goes away cancels its handler, which closes the upstream request.
        handler_cancellation=True,
        # aiohttp arms this at connect and after each response: a request head must arrive in time.
        keepalive_timeout=config.server.header_timeout_s,
        shutdown_timeout=config.server.drain_timeout_s,
        access_log=None,
        # Oversized request lines and headers get aiohttp's own 400 before any handler runs.
        max_line_size=config.server.max_header_bytes,
        max_field_size=config.server.max_header_bytes,
        max_headers=config.server.max_headers,
    )


async def run_until_signal(
    runner: web.AppRunner,
    listen: str,
    on_ready: Callable[[str], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    extra: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve on `listen` until SIGTERM/SIGINT; `runner.cleanup()` then drains in-flight work."""
    host, port = parse_listen(listen)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    if extra is not None:
        await extra()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_ready is not None:
        on_ready(f"http://{host}:{port}")
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if on_stop is not None:
            on_stop()
        # Closes the listening socket first, then waits up to shutdown_timeout for handlers.
        await runner.cleanup()


async def serve_async(
    config: Config,
    on_ready: Callable[[str], None] | None = None,
    config_path: Path | None = None,
) -> None:
    """Serve the router for `config` until a stop signal; SIGHUP reloads `config_path`."""
    app = build_app(config, config_path)
    runner = make_runner(app, config)

    def draining() -> None:
        app[STATE].draining = True
        log.warning(
            "stop signal: draining in-flight requests (up to %gs)", config.server.drain_timeout_s
        )

    async def started() -> None:
        # Startup hooks have run: what they built lives as long as the process.
        gctune.tune(config.server.gc_gen0_threshold)
        # The same app on a second address, so operators can keep /metrics and the admin
        # endpoints on a private interface while `listen` faces clients.
        if config.server.admin_listen is not None:
            host, port = parse_listen(config.server.admin_listen)
            await web.TCPSite(runner, host, port, reuse_address=True).start()
            log.warning("admin listener on http://%s:%d", host, port)

    await run_until_signal(runner, config.server.listen, on_ready, draining, started)


def serve(config: Config, config_path: Path | None = None) -> None:
    """Blocking entry point of `router serve`."""

    def ready(url: str) -> None:
        log.warning("router listening on %s", url)

    uvloop.run(serve_async(config, ready, config_path))
