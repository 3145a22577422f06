"""Fixtures for integration tests: simulated regions and the router as real subprocesses.

Use them from any test directory that imports them (tests/faults re-exports them):

    def test_x(sim_region, router_proc):
        a = sim_region("a", rtt_ms=20)                  # `router sim-region --name a --rtt-ms 20`
        b = sim_region("b", fail_mode="503")
        router = router_proc(regions_toml(a, b))        # or any TOML text with {port} for listen
        OpenAI(base_url=router.url + "/v1", api_key="x")

`sim_stats(proc)` / `sim_config(proc, **changes)` read and change a sim region live.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Proc, free_port, router_cmd, spawn

SimFactory = Callable[..., Proc]
RouterFactory = Callable[..., Proc]
MODEL = "sim-1"


def start_sim(directory: Path, name: str, **flags: Any) -> Proc:
    """Start `router sim-region --name NAME` with flags (rtt_ms=20 -> --rtt-ms 20)."""
    port = free_port()
    args = router_cmd("sim-region", "--port", str(port), "--name", name)
    for key, value in flags.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    proc = spawn(args, port, directory / f"sim-{name}-{port}.log")
    proc.name = name  # type: ignore[attr-defined]
    return proc


def start_router(directory: Path, config_text: str, env: dict[str, str] | None = None) -> Proc:
    """Write the TOML (listen set to a free port) and start `router serve --config`."""
    port = free_port()
    listen = f'listen = "127.0.0.1:{port}"'
    if "[server]" in config_text:
        text = config_text.replace("[server]", f"[server]\n{listen}", 1)
    else:
        text = f"[server]\n{listen}\n{config_text}"
    path = directory / f"router-{port}.toml"
    path.write_text(text)
    return spawn(
        router_cmd("serve", "--config", str(path)), port, directory / f"router-{port}.log", env=env
    )


@pytest.fixture
def sim_region(tmp_path: Path) -> Iterator[SimFactory]:
    """Factory: sim_region(name, **flags) starts `router sim-region`; flags map to --kebab-case."""
    procs: list[Proc] = []

    def start(name: str, **flags: Any) -> Proc:
        proc = start_sim(tmp_path, name, **flags)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def region_toml(proc: Proc, *, models: tuple[str, ...] = (MODEL,), **extra: Any) -> str:
    """One [[regions]] table for a sim region started by `sim_region`."""
    lines = [
        "[[regions]]",
        f'name = "{proc.name}"',  # type: ignore[attr-defined]
        f'base_url = "{proc.url}/v1"',
        f"models = {json.dumps(list(models))}",
    ]
    extra.setdefault("kind", "sim")
    lines += [f"{key} = {json.dumps(value)}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def regions_toml(*procs: Proc, header: str = "") -> str:
    """A router config: `header` (other sections) plus a [[regions]] table per sim region.

    `listen` is filled in by `router_proc`; auth is off unless `header` sets [auth].
    """
    auth = "" if "[auth]" in header else "[auth]\nenabled = false\n"
    return header + "\n" + auth + "\n".join(region_toml(p) for p in procs)


@pytest.fixture
def router_proc(tmp_path: Path) -> Iterator[RouterFactory]:
    """Factory: router_proc(config_text, env=None) writes the TOML and runs `router serve`.

    A `[server]` table in the text gets `listen` set to a free port; without one it is added.
    """
    procs: list[Proc] = []

    def start(config_text: str, env: dict[str, str] | None = None) -> Proc:
        proc = start_router(tmp_path, config_text, env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def _json(url: str, data: dict[str, Any] | None = None) -> Any:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def sim_stats(proc: Proc) -> dict[str, Any]:
    """GET /sim/stats of a sim region."""
    stats: dict[str, Any] = _json(proc.url + "/sim/stats")
    return stats


def sim_config(proc: Proc, **changes: Any) -> dict[str, Any]:
    """POST /sim/config: change a running sim region (e.g. fail_mode="503")."""
    options: dict[str, Any] = _json(proc.url + "/sim/config", changes)
    return options


def sim_reset(proc: Proc) -> None:
    """Zero a sim region's counters."""
    _json(proc.url + "/sim/reset", {})
