"""Config hot reload: decode and validate the new file first, then apply it in one step."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from router.config import Config, load
from router.errors import ConfigError

log = logging.getLogger("router")

Commit = Callable[[], None]
# Given (old, new) config, build a component's new state without touching the live one and return
# the swap; raising ConfigError or ValueError rejects the whole reload. The commit must not fail.
Preparer = Callable[[Config, Config], Commit]

# Fields a running process cannot change: they take effect on restart.
_RESTART_ONLY = (("server", "listen"), ("server", "admin_listen"))


class LiveConfig:
    """The config in force; replaced whole by a reload, so a request reads it once and keeps it."""

    __slots__ = ("config", "generation", "path")

    def __init__(self, config: Config, path: Path | None = None) -> None:
        self.config = config
        self.path = path
        self.generation = 0


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a reload did: applied, or rejected with the reason naming file and field."""

    applied: bool
    generation: int
    message: str


class Reloader:
    """Reloads `live.path` on demand; components register how to take a new config."""

    def __init__(self, live: LiveConfig) -> None:
        self.live = live
        self._preparers: list[tuple[str, Preparer]] = []

    def register(self, name: str, prepare: Preparer) -> None:
        """Have `prepare` called on every reload, in registration order."""
        self._preparers.append((name, prepare))

    def reload(self) -> ReloadResult:
        """Load, validate, prepare every component, then commit all without yielding the loop."""
        path = self.live.path
        if path is None:
            return self._reject("no config file to reload (started without --config)")
        try:
            new = load(path)
        except ConfigError as exc:
            return self._reject(str(exc))
        return self.apply(new, str(path))

    def apply(self, new: Config, source: str) -> ReloadResult:
        """Swap in an already-decoded config; a component that refuses it rejects the reload."""
        old = self.live.config
        commits: list[Commit] = []
        for name, prepare in self._preparers:
            try:
                commits.append(prepare(old, new))
            except (ConfigError, ValueError) as exc:
                return self._reject(f"{source}: {name}: {exc}")
        # No await between the first and last swap: a request sees all of the old or all of the new.
        for commit in commits:
            commit()
        self.live.config = new
        self.live.generation += 1
        for section, key in _RESTART_ONLY:
            before = getattr(getattr(old, section), key)
            after = getattr(getattr(new, section), key)
            if before != after:
                log.warning(
                    "config reload: %s.%s changed (%r -> %r); it takes effect on restart",
                    section,
                    key,
                    before,
                    after,
                )
        message = f"config reloaded from {source} (generation {self.live.generation})"
        log.warning("%s", message)
        return ReloadResult(applied=True, generation=self.live.generation, message=message)

    def _reject(self, reason: str) -> ReloadResult:
        message = (
            f"config reload rejected, still serving generation {self.live.generation}: {reason}"
        )
        log.error("%s", message)
        return ReloadResult(applied=False, generation=self.live.generation, message=message)


RELOADER = web.AppKey("router.reloader", Reloader)


def sighup_ctx(reloader: Reloader) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx that reloads on SIGHUP while the app runs."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, reloader.reload)
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    return ctx
