"""The supervisor's reload checks: what a worker would refuse is refused before anything
changes; a worker takes the generation its snapshot names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from router.access.auth import Authenticator, hash_key
from router.config import Config, loads
from router.errors import ConfigError
from router.routing.health import Health
from router.server import snapshot
from router.server.machine_reload import supervisor_reloader
from router.server.reload import LiveConfig, Reloader
from router.server.tls import Listeners

BASE = f"""
[health]
enabled = false
[auth]
admin_token_sha256 = "{hash_key("admin-0123456789")}"
[[auth.keys]]
sha256 = "{hash_key("sk-a")}"
tenant = "a"
[[regions]]
name = "us"
base_url = "http://127.0.0.1:1"
models = ["m"]
"""


def _supervisor(text: str = BASE) -> tuple[Reloader, Authenticator, Health]:
    config = loads(text)
    auth = Authenticator.from_config(config.auth)
    health = Health(config.health, config.regions)
    return supervisor_reloader(LiveConfig(config), auth, health, Listeners(config)), auth, health


@pytest.mark.parametrize(
    ("new", "named"),
    [
        (BASE.replace(hash_key("admin-0123456789"), hash_key("admin-other")), "auth.admin_token"),
        (BASE.replace("[auth]", "[auth]\nenabled = false"), "auth.enabled"),
        (
            # With a [health] change before it: not applied either.
            BASE.replace("enabled = false", "enabled = false\ninterval_s = 2.0", 1)
            + f'[[auth.keys]]\nsha256 = "{hash_key("sk-a")}"\ntenant = "b"\n',
            "listed twice",
        ),
        (BASE.replace("127.0.0.1:1", "127.0.0.1:2"), "regions"),
    ],
)
def test_what_a_worker_refuses_is_refused_before_anything_changes(new: str, named: str) -> None:
    reloader, auth, health = _supervisor()
    tenants, health_config = auth.tenants, health.config
    with pytest.raises(ConfigError, match=named):
        reloader.prepare(loads(new), "router.toml")
    assert auth.tenants == tenants
    assert health.config is health_config


def test_a_reload_the_workers_take_is_prepared_and_committed() -> None:
    reloader, auth, health = _supervisor()
    changed = BASE.replace('tenant = "a"', 'tenant = "b"')
    new = loads(changed.replace("enabled = false", "enabled = false\ninterval_s = 2.0", 1))
    reloader.commit(reloader.prepare(new, "router.toml"))
    assert [t.name for t in auth.tenants] == ["b"]
    assert health.config.interval_s == 2.0


def test_a_snapshot_names_its_generation_and_a_worker_takes_it(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    snapshot.write(str(path), BASE, 3)
    text = path.read_text()
    assert snapshot.generation(text) == 3
    assert snapshot.generation(BASE) is None
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]
    config: Config = loads(text)
    # Another router's file with the same first line is only a comment: a full reload.
    alone = Reloader(LiveConfig(config, path, generation=3))
    assert alone.reload().generation == 4
    reloader = Reloader(LiveConfig(config, path, generation=3), snapshot=True)
    # The generation it runs: nothing to do.
    assert reloader.reload().generation == 3
    assert reloader.live.config is config
    # A newer one, whatever came in between: its number, not the next.
    snapshot.write(str(path), BASE.replace('tenant = "a"', 'tenant = "b"'), 5)
    result = reloader.reload()
    assert (result.applied, result.generation) == (True, 5)
    assert reloader.live.config.auth.keys[0].tenant == "b"


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda t: '[server]\nlisten = "127.0.0.1:9999"\n' + t, "server.listen"),
        (lambda t: t + '\n[observability]\nlog_level = "debug"\n', "observability"),
        (lambda t: t + "\n[limits]\ndefault_max_tokens = 7\n", "limits"),
    ],
)
def test_what_only_a_restart_applies_is_refused_with_workers(
    edit: Callable[[str], str], field: str
) -> None:
    # A worker restarted later would run it beside the others: refused, naming the field.
    reloader, _, _ = _supervisor()
    with pytest.raises(ConfigError, match=f"field `{field}`: changed, but it takes effect only"):
        reloader.prepare(loads(edit(BASE)), "router.toml")
