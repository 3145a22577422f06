"""The supervisor's side of a reload: refuse, once and before anything changes, what a worker
would refuse (its reload, or its start from the new config after a restart).

The rules are the workers' own: the same Reloader, with each of their preparers' checks (or the
same preparer where the supervisor runs that component itself), so the rejection reads the same.
"""

from __future__ import annotations

from collections.abc import Callable

from router.access.auth import Authenticator
from router.config import Commit, Config, Preparer
from router.rollout.table import table_from_config
from router.routing.fallback import Fallbacks
from router.routing.health import Health
from router.routing.runtime import LiveRouting
from router.server.app import check
from router.server.reload import LiveConfig, Reloader, health_preparer
from router.server.tls import Listeners


def supervisor_reloader(
    live: LiveConfig, auth: Authenticator, health: Health, listeners: Listeners
) -> Reloader:
    """A Reloader for the supervisor: its commits change its own admin token check (tenant
    keys only), its prober's [health] and its admin listener's certificate; every other
    preparer only checks. Regions changes are refused (no preparer takes them)."""
    reloader = Reloader(live, refuse_restart_only=True)
    reloader.register("rollout", _checking(table_from_config), ("rollout", "models"))
    reloader.register("auth", _auth_preparer(auth), ("auth",))
    reloader.register("health", health_preparer(health), ("health",))
    reloader.register("routing", _routing, ("routing",))
    reloader.register("fallbacks", _fallbacks, ("models",))
    reloader.register("tls", listeners.preparer(), ())
    # A worker restarted later starts from this config: what would stop it starting.
    reloader.register("start", _checking(_startable), ())
    return reloader


def _checking(rule: Callable[[Config], object]) -> Preparer:
    """A preparer that only checks `rule(new)`; its commit does nothing."""

    def prepare(old: Config, new: Config) -> Commit:
        rule(new)
        return _nothing

    return prepare


def _nothing() -> None:
    pass


def _auth_preparer(auth: Authenticator) -> Preparer:
    """access.limits.auth_preparer's rules; the supervisor's keys guard /admin/* (403 for a
    tenant key), so it adopts them too."""

    def prepare(old: Config, new: Config) -> Commit:
        if new.auth == old.auth:
            return _nothing
        fresh = Authenticator.reloaded(old.auth, new.auth)
        return lambda: auth.adopt(fresh)

    return prepare


def _routing(old: Config, new: Config) -> Commit:
    """The workers' [routing] preparer, run on a throwaway copy."""
    LiveRouting(old.routing).prepare(old, new)
    return _nothing


def _fallbacks(old: Config, new: Config) -> Commit:
    """The workers' [models] fallbacks preparer, run on a throwaway copy."""
    Fallbacks(old.models).prepare_reload(old, new)
    return _nothing


def _startable(config: Config) -> None:
    """What a worker's start refuses beyond the schema: keys, [health], regions' URLs,
    tokenizers (app.check) and the certificate files (even for TLS turned on by this reload)."""
    check(config)
    Listeners(config)
