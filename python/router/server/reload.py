"""Config hot reload: decode and validate the new file first, then apply it in one step."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from router.config import Commit, Config, Preparer, loads, read
from router.core.admin import AdminRoutes, json_response
from router.errors import ConfigError, InvalidRequest
from router.native import Prober
from router.routing.health import Health, prober_kwargs
from router.server import snapshot

log = logging.getLogger("router")


# Sections the reload applies itself: requests read them from the live config.
_LIVE_SECTIONS = frozenset({"server", "timeouts"})
# Fields of those that are fixed when sockets and pools open: they take effect on restart.
_RESTART_ONLY = (
    ("server", "listen"),
    ("server", "admin_listen"),
    ("server", "workers"),
    ("server", "header_timeout_s"),
    ("server", "drain_timeout_s"),
    ("server", "max_header_bytes"),
    ("server", "max_headers"),
    ("server", "max_in_flight_per_ip"),
    ("server", "max_response_head_bytes"),
    ("server", "gc_gen0_threshold"),
    ("timeouts", "connect"),
    ("timeouts", "total"),
)
# A change no component can apply here rejects the reload rather than routing half-configured.
_MUST_APPLY = frozenset({"regions"})


class LiveConfig:
    """The config in force; replaced whole by a reload, so a request reads it once and keeps it."""

    __slots__ = ("config", "generation", "path")

    def __init__(self, config: Config, path: Path | None = None, generation: int = 0) -> None:
        self.config = config
        self.path = path
        # A worker restarted by the supervisor starts at the generation its siblings are at.
        self.generation = generation


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a reload did: applied, or rejected with the reason naming file and field."""

    applied: bool
    generation: int
    message: str


class Reloader:
    """Reloads `live.path` on demand; components register how to take a new config."""

    def __init__(
        self, live: LiveConfig, *, snapshot: bool = False, refuse_restart_only: bool = False
    ) -> None:
        self.live = live
        # A supervised worker's: its file is the supervisor's snapshot, whose first line names
        # the generation (any other file's first line is only a comment).
        self.snapshot = snapshot
        # The supervisor's: a change that only a restart applies is refused, not put off, since
        # a worker restarted later would run it beside workers that do not.
        self.refuse_restart_only = refuse_restart_only
        self._preparers: list[tuple[str, Preparer]] = []
        self._handled: set[str] = set(_LIVE_SECTIONS)

    def register(self, name: str, prepare: Preparer, sections: tuple[str, ...]) -> None:
        """Have `prepare` called on every reload, in order; it applies these config sections."""
        self._preparers.append((name, prepare))
        self._handled.update(sections)

    def reload(self) -> ReloadResult:
        """Load, validate, prepare every component, then commit all without yielding the loop.

        A supervisor's snapshot names its generation: a worker takes that one, and one it
        already runs (or an older one) is left alone."""
        path = self.live.path
        if path is None:
            return self._reject("no config file to reload (started without --config)")
        try:
            text = read(path)
            generation = snapshot.generation(text) if self.snapshot else None
            if generation is not None and generation <= self.live.generation:
                message = f"{path}: generation {generation} already applied"
                log.debug("%s", message)
                return ReloadResult(applied=True, generation=self.live.generation, message=message)
            new = loads(text, str(path), os.environ)
        except ConfigError as exc:
            return self._reject(str(exc))
        return self.apply(new, str(path), generation)

    def prepare(self, new: Config, source: str) -> list[Commit]:
        """Every component's commit for `new`, nothing changed yet; ConfigError naming
        `source` and the component if one refuses it (a component's bug refuses it too)."""
        changed = _changed_sections(self.live.config, new)
        blocking = [name for name in sorted(changed - self._handled) if name in _MUST_APPLY]
        if blocking:
            raise ConfigError(
                f"{source}: field `{blocking[0]}`: changed, but this router cannot add, remove or "
                "change regions while running; restart it to apply"
            )
        if self.refuse_restart_only:
            later = self.restart_only(self.live.config, new)
            if later:
                raise ConfigError(
                    f"{source}: field `{later[0]}`: changed, but it takes effect only on restart, "
                    "and a worker restarted later would run it beside workers that do not; "
                    "restart the router to apply it (or leave it as it is to reload the rest)"
                )
        commits: list[Commit] = []
        for name, prepare in self._preparers:
            try:
                commits.append(prepare(self.live.config, new))
            except (ConfigError, ValueError) as exc:
                raise ConfigError(f"{source}: {name}: {exc}") from None
            except Exception as exc:
                # A bug in one component must not take the process down or half-apply anything.
                log.exception("config reload: %s failed to prepare", name)
                raise ConfigError(f"{source}: {name}: internal error: {exc!r}") from None
        return commits

    def commit(self, commits: list[Commit]) -> None:
        """Apply what prepare() returned, in order; a commit that fails is logged, not raised."""
        # No await between the first and last swap: a request sees all of the old or all of the new.
        for (name, _), commit in zip(self._preparers, commits, strict=True):
            try:
                commit()
            except Exception:
                log.exception(
                    "config reload: %s failed to apply; that component is inconsistent", name
                )

    def apply(self, new: Config, source: str, generation: int | None = None) -> ReloadResult:
        """Swap in an already-decoded config (as `generation`, else the next one); a component
        that refuses it rejects the reload."""
        old = self.live.config
        try:
            commits = self.prepare(new, source)
        except ConfigError as exc:
            return self._reject(str(exc))
        self.commit(commits)
        self.live.config = new
        self.live.generation = self.live.generation + 1 if generation is None else generation
        for field in self.restart_only(old, new):
            if "." not in field:
                log.warning(
                    "config reload: [%s] changed but is not hot-reloadable; it takes effect on "
                    "restart",
                    field,
                )
                continue
            section, key = field.split(".")
            before = getattr(getattr(old, section), key)
            after = getattr(getattr(new, section), key)
            log.warning(
                "config reload: %s changed (%r -> %r); it takes effect on restart",
                field,
                before,
                after,
            )
        message = f"config reloaded from {source} (generation {self.live.generation})"
        log.info("%s", message)
        return ReloadResult(applied=True, generation=self.live.generation, message=message)

    def restart_only(self, old: Config, new: Config) -> list[str]:
        """What `new` changes that only a restart applies: sections no component takes, the
        [server] and [timeouts] fields fixed when sockets and pools open, TLS on or off."""
        fields = sorted(_changed_sections(old, new) - self._handled)
        for section, key in _RESTART_ONLY:
            if getattr(getattr(old, section), key) != getattr(getattr(new, section), key):
                fields.append(f"{section}.{key}")
        for key in ("tls", "admin_tls"):
            if (getattr(old.server, key) is None) != (getattr(new.server, key) is None):
                fields.append(f"server.{key}")
        return fields

    def _reject(self, reason: str) -> ReloadResult:
        message = (
            f"config reload rejected, still serving generation {self.live.generation}: {reason}"
        )
        log.error("%s", message)
        return ReloadResult(applied=False, generation=self.live.generation, message=message)


RELOADER = web.AppKey("router.reloader", Reloader)


def health_preparer(health: Health) -> Preparer:
    """[health] on reload: new probe settings and thresholds, history kept; probing on or off."""

    def prepare(old: Config, new: Config) -> Commit:
        if new.health == old.health:
            return lambda: None
        # A throwaway prober checks the values the native side refuses, before anything swaps.
        Prober(**prober_kwargs(new.health))

        def commit() -> None:
            health.reconfigure(new.health)
            health.set_probing(new.health.enabled)

        return commit

    return prepare


def _changed_sections(old: Config, new: Config) -> set[str]:
    """Top-level config fields whose value differs."""
    return {f for f in old.__struct_fields__ if getattr(old, f) != getattr(new, f)}


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


def add_routes(routes: AdminRoutes) -> None:
    """POST /admin/reload behind the admin guard."""

    async def reload(request: web.Request) -> web.Response:
        """Reload the config file; 400 naming file and field if the new one is invalid."""
        result = request.app[RELOADER].reload()
        if not result.applied:
            raise InvalidRequest(result.message, code="invalid_config")
        return json_response(
            {"status": "applied", "generation": result.generation, "message": result.message}
        )

    routes.post("/reload", reload)
