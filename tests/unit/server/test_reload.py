"""Reload: a broken file is rejected and the old config stays; a valid one swaps every component."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from router.config import Config, load, loads
from router.rollout.table import Rollout, table_from_config
from router.routing.health import Health
from router.server.reload import Commit, LiveConfig, Reloader, health_preparer

GOOD = """
[[regions]]
name = "us"
base_url = "http://127.0.0.1:1"
models = ["llama-v1", "llama-v2"]

[rollout.models.chat]
deployments = [
  { version = "v1", model = "llama-v1", weight = 95 },
  { version = "v2", model = "llama-v2", weight = 5 },
]
"""


def setup(tmp_path: Path, text: str = GOOD) -> tuple[Path, Reloader, Rollout]:
    path = tmp_path / "router.toml"
    path.write_text(text)
    config = load(path)
    rollout = Rollout(table_from_config(config))
    reloader = Reloader(LiveConfig(config, path))

    def prepare(old: Config, new: Config) -> Commit:
        table = table_from_config(new)
        return lambda: rollout.replace(table)

    reloader.register("rollout", prepare, ("rollout",))
    return path, reloader, rollout


def test_valid_reload_applies_new_weights(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, reloader, rollout = setup(tmp_path)
    path.write_text(
        GOOD.replace("weight = 95", "weight = 50").replace("weight = 5 ", "weight = 50 ")
    )
    with caplog.at_level(logging.INFO, logger="router"):
        result = reloader.reload()
    assert result.applied
    assert result.generation == 1
    assert reloader.live.generation == 1
    assert rollout.table.alias("chat").weights() == {"v1": 50.0, "v2": 50.0}
    assert reloader.live.config.rollout.models["chat"].deployments[0].weight == 50.0
    assert f"config reloaded from {path}" in caplog.text


@pytest.mark.parametrize(
    ("broken", "named"),
    [
        ("[[regions]\n", "invalid TOML"),
        (
            GOOD.replace('model = "llama-v2"', 'model = "gone"'),
            "rollout.models.chat.deployments[1]",
        ),
        (GOOD.replace("weight = 5 ", 'weight = "five" '), "deployments[1].weight"),
        (GOOD + "\n[nonsense]\n", "nonsense"),
    ],
)
def test_invalid_reload_rejected_and_old_config_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str, named: str
) -> None:
    path, reloader, rollout = setup(tmp_path)
    before_config, before_table = reloader.live.config, rollout.table
    path.write_text(broken)
    with caplog.at_level(logging.ERROR, logger="router"):
        result = reloader.reload()
    assert not result.applied
    assert reloader.live.config is before_config
    assert rollout.table is before_table
    [line] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert str(path) in line.getMessage()
    assert named in line.getMessage()
    assert "rejected, still serving generation 0" in line.getMessage()


def test_missing_file_rejected(tmp_path: Path) -> None:
    path, reloader, _ = setup(tmp_path)
    path.unlink()
    result = reloader.reload()
    assert not result.applied
    assert "cannot read config" in result.message


def test_a_refusing_component_rejects_the_whole_reload(tmp_path: Path) -> None:
    path, reloader, rollout = setup(tmp_path)
    applied: list[str] = []

    def refuses(old: Config, new: Config) -> Commit:
        raise ValueError("field `limits.x`: cannot shrink below in-use")

    def records(old: Config, new: Config) -> Commit:
        return lambda: applied.append("late")

    reloader.register("limits", refuses, ("limits",))
    reloader.register("cache", records, ("cache",))
    before = rollout.table
    path.write_text(GOOD.replace("weight = 95", "weight = 10"))
    result = reloader.reload()
    assert not result.applied
    assert "limits: field `limits.x`" in result.message
    # the rollout preparer ran but its commit did not
    assert rollout.table is before
    assert applied == []


def test_restart_only_change_applies_rest_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, reloader, rollout = setup(tmp_path)
    text = GOOD.replace("weight = 95", "weight = 90") + '\n[server]\nlisten = "127.0.0.1:9999"\n'
    path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="router"):
        assert reloader.reload().applied
    assert rollout.table.alias("chat").weights()["v1"] == 90.0
    assert "server.listen changed" in caplog.text
    assert "takes effect on restart" in caplog.text


@pytest.mark.parametrize(
    "field",
    [
        "max_header_bytes = 32768",
        "max_headers = 64",
        "max_in_flight_per_ip = 7",
        "max_response_head_bytes = 4096",
        "gc_gen0_threshold = 900",
    ],
)
def test_server_fields_fixed_at_start_say_so_on_reload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str
) -> None:
    """Fixed when the listener, parser or pools are set up: a reload says it waits for a restart."""
    path, reloader, _ = setup(tmp_path)
    path.write_text(f"{GOOD}\n[server]\n{field}\n")
    with caplog.at_level(logging.WARNING, logger="router"):
        assert reloader.reload().applied
    name = field.partition(" ")[0]
    assert f"server.{name} changed" in caplog.text
    assert "takes effect on restart" in caplog.text


def test_no_file_to_reload() -> None:
    config = loads(GOOD)
    result = Reloader(LiveConfig(config, None)).reload()
    assert not result.applied
    assert "no config file" in result.message


def test_region_change_rejected_when_nothing_can_apply_it(tmp_path: Path) -> None:
    path, reloader, rollout = setup(tmp_path)
    before = rollout.table
    path.write_text(GOOD.replace("127.0.0.1:1", "127.0.0.1:7").replace("weight = 95", "weight = 1"))
    result = reloader.reload()
    assert not result.applied
    assert "field `regions`: changed" in result.message
    assert rollout.table is before


def test_region_change_applied_by_a_component_that_handles_regions(tmp_path: Path) -> None:
    path, reloader, _ = setup(tmp_path)
    seen: list[str] = []

    def regions(old: Config, new: Config) -> Commit:
        return lambda: seen.append(new.regions[0].base_url)

    reloader.register("regions", regions, ("regions",))
    path.write_text(GOOD.replace("127.0.0.1:1", "127.0.0.1:7"))
    assert reloader.reload().applied
    assert seen == ["http://127.0.0.1:7"]


def test_unhandled_section_applies_rest_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, reloader, rollout = setup(tmp_path)
    path.write_text(
        GOOD.replace("weight = 95", "weight = 80") + "\n[limits]\ndefault_max_tokens = 9\n"
    )
    with caplog.at_level(logging.WARNING, logger="router"):
        assert reloader.reload().applied
    assert rollout.table.alias("chat").weights()["v1"] == 80.0
    assert "[limits] changed but is not hot-reloadable" in caplog.text
    assert "[rollout]" not in caplog.text


def test_health_section_reconfigures_the_prober(tmp_path: Path) -> None:
    path, reloader, _ = setup(tmp_path, GOOD + "\n[health]\nenabled = false\n")
    health = Health(reloader.live.config.health, reloader.live.config.regions)
    reloader.register("health", health_preparer(health), ("health",))
    path.write_text(GOOD + "\n[health]\nenabled = false\ninterval_s = 3.0\n")
    assert reloader.reload().applied
    assert health.config.interval_s == 3.0
    assert not health.prober.running


def test_health_values_the_prober_refuses_reject_the_reload(tmp_path: Path) -> None:
    path, reloader, rollout = setup(tmp_path, GOOD + "\n[health]\nenabled = false\n")
    health = Health(reloader.live.config.health, reloader.live.config.regions)
    reloader.register("health", health_preparer(health), ("health",))
    before = rollout.table
    path.write_text(
        GOOD.replace("weight = 95", "weight = 1") + '\n[health]\nenabled = false\npath = "health"\n'
    )
    result = reloader.reload()
    assert not result.applied
    assert "health: invalid prober config: probe paths must start with '/'" in result.message
    assert health.config.path == "/health"
    assert rollout.table is before


def test_a_crashing_preparer_rejects_instead_of_raising(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, reloader, rollout = setup(tmp_path)

    def crashes(old: Config, new: Config) -> Commit:
        raise RuntimeError("bug")

    reloader.register("buggy", crashes, ("cache",))
    before = rollout.table
    path.write_text(GOOD.replace("weight = 95", "weight = 10"))
    with caplog.at_level(logging.ERROR, logger="router"):
        result = reloader.reload()
    assert not result.applied
    assert "buggy: internal error: RuntimeError('bug')" in result.message
    assert rollout.table is before
    assert "buggy failed to prepare" in caplog.text
