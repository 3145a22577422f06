"""Region health for the app's lifetime: the native prober, passive reports, admin drain/disable.

A worker of `router serve --workers N` probes nothing itself: it routes from the machine's table
that the supervisor's one prober publishes, and sends its passive reports there
(routing.shared_health).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiohttp import web

from router.config import HealthConfig, RegionConfig, RoutingConfig
from router.errors import ConfigError
from router.native import Prober
from router.net.redaction import display_url, redact
from router.routing.selection import AdminState, Candidate, Selection, select
from router.routing.shared_health import RegionView, SharedHealth

log = logging.getLogger("router.health")

# How often prober transitions are taken from the native queue and logged.
_EVENT_POLL_S = 0.25


def prober_kwargs(config: HealthConfig) -> dict[str, Any]:
    """[health] as the native Prober's keyword arguments."""
    return {
        "interval_s": config.interval_s,
        "jitter": config.jitter,
        "timeout_s": config.timeout_s,
        "path": config.path,
        "fallback_path": config.fallback_path,
        "ca_file": config.ca_file,
        "expected_statuses": list(config.expected_statuses),
        "healthy_after": config.healthy_after,
        "unhealthy_after": config.unhealthy_after,
        "ewma_alpha": config.ewma_alpha,
        "window": config.window,
        "eject_after": config.eject_after,
        "base_ejection_s": config.base_ejection_s,
        "max_ejection_s": config.max_ejection_s,
    }


def outcome_of(kind: str | None, status: int | None) -> str:
    """A proxy attempt's result as a prober outcome: what it says about the region's health."""
    if kind is None:
        return "ok"
    if kind == "connect":
        return "connect_error"
    if kind == "timeout":
        return "timeout"
    if kind == "status" and status is not None and status < 500:
        # 429 (and other 4xx): the region is alive, just busy or refusing this one request.
        return "neutral"
    return "server_error"


class Health:
    """Owns the prober (or reads the machine's), the admin state of each region and the
    in-flight count per region."""

    def __init__(
        self,
        config: HealthConfig,
        regions: Sequence[RegionConfig],
        rng: random.Random | None = None,
        machine: SharedHealth | None = None,
    ) -> None:
        try:
            self.prober = Prober(**prober_kwargs(config))
        except ValueError as exc:
            raise ConfigError(f"[health]: {exc}") from None
        self.config = config
        # A worker's view of the machine's prober; None: this process probes.
        self.machine = machine
        self.rng = rng or random.Random()
        self._bias_s: dict[str, float] = {}
        self._admin: dict[str, AdminState] = {}
        # In-flight attempts per region; the app points this at admission's counters.
        self.in_flight_of: Callable[[str], int] = lambda name: 0
        self.set_regions(regions)

    # ---- lifecycle ----

    def start(self) -> None:
        """Start probing (no-op when [health] enabled = false: passive signals only, or when
        the machine's prober probes for this worker)."""
        if self.config.enabled and self.machine is None:
            self.prober.start()

    def stop(self) -> None:
        """Stop probing and join the prober thread."""
        self.prober.stop()

    @property
    def probing(self) -> bool:
        """Whether regions are being probed (by this process or the machine's prober)."""
        if self.machine is not None:
            return self.machine.table.probing()
        return self.prober.running

    def set_probing(self, enabled: bool) -> None:
        """Probing on or off after a reload (the machine's prober follows its own reload)."""
        if enabled and not self.prober.running:
            self.start()
        elif not enabled and self.prober.running:
            self.stop()

    def set_regions(self, regions: Iterable[RegionConfig]) -> None:
        """Adopt the configured regions (hot reload): add, re-point or forget; admin state kept."""
        wanted = {r.name: r for r in regions}
        for name in self.prober.regions():
            if name not in wanted:
                self.prober.remove_region(name)
                self._admin.pop(name, None)
        for name, region in wanted.items():
            try:
                self.prober.upsert_region(name, region.base_url, path=region.probe_path())
            except ValueError as exc:
                # The native message quotes the URL, credentials and all.
                raise ConfigError(f"regions.{name}.base_url: {redact(str(exc))}") from None
            self._bias_s[name] = region.bias_ms / 1000
            self._admin.setdefault(name, AdminState.ACTIVE)

    def reconfigure(self, config: HealthConfig) -> None:
        """Adopt a new [health] section without losing history."""
        try:
            self.prober.configure(**prober_kwargs(config))
        except ValueError as exc:
            raise ConfigError(f"[health]: {exc}") from None
        self.config = config

    def log_events(self) -> None:
        """Log every health flip since the last call at INFO (nothing per probe)."""
        if self.machine is not None:
            return  # the machine's prober logs them, once for the machine
        for region, transition, _at, detail in self.prober.take_events():
            suffix = f" ({detail})" if detail and transition in ("unhealthy", "ejected") else ""
            log.info("region %s: %s%s", region, transition, suffix)

    # ---- reads ----

    def snapshot(self) -> Mapping[str, RegionView]:
        """Every region's health now, by name."""
        if self.machine is not None:
            return self.machine.table.snapshot()
        return {h.name: h for h in self.prober.snapshot()}

    def admin_state(self, name: str) -> AdminState | None:
        """The operator's setting for a region; None if the region is unknown."""
        if name not in self._admin:
            return None
        return self._admin_of(name)

    def admin_states(self) -> dict[str, str]:
        """Every region's operator setting, by name (what the machine's prober publishes)."""
        return {name: state.value for name, state in self._admin.items()}

    def _admin_of(self, name: str, published: Mapping[str, str] | None = None) -> AdminState:
        """A region's operator setting: a worker takes the machine's (set through the
        supervisor, so a restarted worker keeps a drain) over its own."""
        if self.machine is not None:
            if published is None:
                published = self.machine.table.admin()
            value = published.get(name)
            if value is not None:
                return AdminState(value)
        return self._admin.get(name, AdminState.ACTIVE)

    def candidates(self, names: Iterable[str]) -> list[Candidate]:
        """Selection input for the regions `names` (those serving the requested model)."""
        view = {}
        machine = self.machine
        rows = machine.table.routing_view() if machine is not None else self.prober.routing_view()
        for row in rows:
            view[row[0]] = row
        stale_s = self.config.ttft_stale_s
        published = machine.table.admin() if machine is not None else None
        out = []
        for name in names:
            v = view.get(name)
            if v is None:
                available = healthy = True
                rtt = ttft = None
            else:
                _, available, healthy, rtt, ttft, ttft_age = v
                if ttft_age is None or ttft_age > stale_s:
                    ttft = None
            out.append(
                Candidate(
                    name=name,
                    available=available,
                    healthy=healthy,
                    ewma_rtt_s=rtt,
                    ewma_ttft_s=ttft,
                    bias_s=self._bias_s.get(name, 0.0),
                    in_flight=self.in_flight_of(name),
                    admin=self._admin_of(name, published),
                )
            )
        return out

    def select(self, names: Iterable[str], routing: RoutingConfig) -> Selection:
        """The ordered fallbacks among `names` under the [routing] policy."""
        return select(
            self.candidates(names),
            tolerance_s=routing.tolerance_ms / 1000,
            rng=self.rng,
            panic=routing.panic_routing,
        )

    def any_available(self) -> bool:
        """Readiness: at least one active region is healthy and not ejected."""
        snap = self.snapshot()
        return any(
            h.available and name in self._admin and self._admin_of(name) is AdminState.ACTIVE
            for name, h in snap.items()
        )

    def stats(self) -> dict[str, Any]:
        """JSON-ready health view for the admin API."""
        regions = []
        for h in self.snapshot().values():
            regions.append(
                {
                    "name": h.name,
                    # A base_url may carry credentials (user:pass@, ?token=): never shown.
                    "url": display_url(h.url),
                    "admin": self._admin_of(h.name).value,
                    "available": h.available,
                    "healthy": h.healthy,
                    "probed": h.probed,
                    "ejected": h.ejected,
                    "ejected_for_s": h.ejected_for_s,
                    "ejected_until": h.ejected_until,
                    "ejections": h.ejections,
                    "in_flight": self.in_flight_of(h.name),
                    "bias_ms": self._bias_s.get(h.name, 0.0) * 1000,
                    "ewma_rtt_ms": _ms(h.ewma_rtt_s),
                    "rtt_p50_ms": _ms(h.rtt_p50_s),
                    "rtt_p95_ms": _ms(h.rtt_p95_s),
                    "ewma_ttft_ms": _ms(h.ewma_ttft_s),
                    "ttft_p50_ms": _ms(h.ttft_p50_s),
                    "ttft_p95_ms": _ms(h.ttft_p95_s),
                    "consecutive_failures": h.consecutive_failures,
                    "passive_failures": h.passive_failures,
                    "probes": h.probes,
                    "probe_failures": h.probe_failures,
                    "passive_reports": h.passive_reports,
                    "last_probe_age_s": h.last_probe_age_s,
                    "last_error": None if h.last_error is None else redact(h.last_error),
                }
            )
        return {"probing": self.probing, "regions": regions}

    # ---- writes ----

    def set_admin(self, name: str, state: AdminState) -> bool:
        """Drain, disable or re-enable a region; False if it is unknown."""
        if name not in self._admin:
            return False
        before = self._admin[name]
        self._admin[name] = state
        if before is not state:
            log.info("region %s: admin %s -> %s", name, before.value, state.value)
        return True

    def report(
        self,
        region: str,
        outcome: str,
        *,
        connect_s: float | None = None,
        ttft_s: float | None = None,
        total_s: float | None = None,
    ) -> None:
        """Feed one attempt's outcome to the health table (passive health, ejection)."""
        if self.machine is not None:
            self.machine.sender.report(region, outcome, connect_s, ttft_s, total_s)
            return
        if self.prober.report(region, outcome, connect_s, ttft_s, total_s):
            log.info("region %s: ejected after consecutive %s", region, outcome)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def lifetime(health: Health) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx entry: probe while the app runs, log flips, stop the thread at shutdown."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        health.start()

        async def pump() -> None:
            while True:
                await asyncio.sleep(_EVENT_POLL_S)
                health.log_events()

        task = asyncio.create_task(pump(), name="router.health.events")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            health.stop()
            health.log_events()

    return ctx
