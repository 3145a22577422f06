"""`router serve --workers N` and the config, as real processes: a restarted worker runs its
siblings' config (the supervisor's snapshot), not whatever the file says by then; a reload a
worker would refuse is refused by the supervisor before anything changes; SIGHUPs while a
worker starts neither kill it nor leave it behind."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from router.access.auth import hash_key
from tests.integration.conftest import MODEL, RouterFactory, SimFactory, region_toml, sim_stats
from tests.integration.test_workers import (
    _all_serving,
    _chat,
    _children,
    _machine_metrics,
    _metrics,
    _series,
    _until,
)
from tests.support import Proc, free_port, wait_for_port

ADMIN = "admin-config-0123456789"
OTHER_ADMIN = "admin-config-9876543210"
KEY = "sk-config-0123456789abcdef"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("worker", timeout=10)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(self._path)
        self.sock = sock


def _worker_sockets(router: Proc) -> list[str]:
    """Each running worker's own operator socket (in the supervisor's private directory)."""
    sockets = []
    for pid in _children(router.popen.pid):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        machine_dir = args[args.index(b"--machine-dir") + 1].decode()
        index = args[args.index(b"--worker") + 1].decode().split(":")[0]
        sockets.append(os.path.join(machine_dir, f"w{index}.sock"))
    return sockets


def _target(sock: str, alias: str) -> str:
    """The model `alias` goes to in this worker's rollout table."""
    conn = _UnixConnection(sock)
    try:
        conn.request("GET", "/admin/rollout", headers={"Authorization": f"Bearer {ADMIN}"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        table = json.loads(resp.read())
    finally:
        conn.close()
    target: str = table["models"][alias]["deployments"][0]["upstream_model"]
    return target


def _config_path(router: Proc, tmp_path: Path) -> Path:
    return tmp_path / f"router-{router.port}.toml"


def _kill_one_worker(router: Proc, workers: int) -> None:
    """SIGKILL one worker; return once its successor and its siblings all serve."""
    restarts = router.output().count("restarting it")
    victim = _children(router.popen.pid)[0]
    os.kill(victim, signal.SIGKILL)
    _until(lambda: router.output().count("restarting it") > restarts, "the restart")

    def replaced() -> bool:
        assert router.popen.poll() is None, router.output()
        children = _children(router.popen.pid)
        return len(children) == workers and victim not in children

    _until(replaced, "a new worker")
    _all_serving(router, workers)


def _aliased_config(sim: Proc, target: str) -> str:
    return (
        "[server]\nworkers = 2\n"
        f'[auth]\nenabled = false\nadmin_token_sha256 = "{hash_key(ADMIN)}"\n'
        f'[models]\naliases = {{ chat = "{target}" }}\n' + region_toml(sim, models=(MODEL, "sim-2"))
    )


@pytest.mark.timeout(120)
def test_a_restarted_worker_runs_its_siblings_config_not_an_edited_file(
    sim_region: SimFactory, router_proc: RouterFactory, tmp_path: Path
) -> None:
    router = router_proc(_aliased_config(sim_region("a"), MODEL))
    _all_serving(router, 2)
    path = _config_path(router, tmp_path)
    # Edited, valid, not reloaded: the running config is still the old one.
    path.write_text(path.read_text().replace('chat = "sim-1"', 'chat = "sim-2"'))
    _kill_one_worker(router, 2)
    assert [_target(s, "chat") for s in _worker_sockets(router)] == [MODEL, MODEL]
    assert _series(_machine_metrics(router), "router_config_generation") == [0.0, 0.0]
    # Reloaded: both take it, and a worker restarted after that runs it too.
    router.popen.send_signal(signal.SIGHUP)
    router.wait_output("by 2 workers (generation 1)")
    _until(
        lambda: [_target(s, "chat") for s in _worker_sockets(router)] == ["sim-2", "sim-2"],
        "both workers at the reloaded alias",
    )
    _kill_one_worker(router, 2)
    assert [_target(s, "chat") for s in _worker_sockets(router)] == ["sim-2", "sim-2"]
    assert _series(_machine_metrics(router), "router_config_generation") == [1.0, 1.0]


@pytest.mark.timeout(120)
def test_a_restarted_worker_starts_although_the_file_no_longer_loads(
    sim_region: SimFactory, router_proc: RouterFactory, tmp_path: Path
) -> None:
    router = router_proc(_aliased_config(sim_region("a"), MODEL))
    _all_serving(router, 2)
    path = _config_path(router, tmp_path)
    path.write_text(path.read_text() + "\noops = [\n")
    router.popen.send_signal(signal.SIGHUP)
    router.wait_output("config reload rejected")
    # Before: the new worker read the broken file, exited 2 five times, and the supervisor
    # stopped the healthy one too and exited 1 (a unit that does not restart on exit 1).
    _kill_one_worker(router, 2)
    assert [_target(s, "chat") for s in _worker_sockets(router)] == [MODEL, MODEL]
    assert [_chat(router) for _ in range(6)] == [200] * 6
    assert router.popen.poll() is None


def _admin(port: int, method: str, path: str, token: str) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=b"" if method == "POST" else None,
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _probes(region: Proc) -> int:
    probes: int = sim_stats(region)["probes"]
    return probes


def _keyed_machine(sim_region: SimFactory, router_proc: RouterFactory) -> tuple[Proc, Proc, int]:
    """Two workers with an admin listener, an admin token and one tenant key, probing every
    0.2 s: the router, its region and the admin port."""
    region = sim_region("a")
    admin = free_port()
    config = (
        f'[server]\nworkers = 2\nadmin_listen = "127.0.0.1:{admin}"\n'
        "[health]\ninterval_s = 0.2\n"
        f'[auth]\nadmin_token_sha256 = "{hash_key(ADMIN)}"\n'
        f'[[auth.keys]]\nsha256 = "{hash_key(KEY)}"\ntenant = "t"\n' + region_toml(region)
    )
    router = router_proc(config)
    wait_for_port(admin, proc=router.popen)
    _until(lambda: len(_series(_metrics(admin), "router_config_generation")) == 2, "2 workers")
    return router, region, admin


@pytest.mark.timeout(120)
def test_a_new_admin_token_is_refused_by_the_supervisor_as_by_the_workers(
    sim_region: SimFactory, router_proc: RouterFactory, tmp_path: Path
) -> None:
    router, _, admin = _keyed_machine(sim_region, router_proc)
    path = _config_path(router, tmp_path)
    good = path.read_text()
    # Every worker refuses it (restart-only): had the supervisor taken it, /admin/* would
    # take neither token.
    path.write_text(good.replace(hash_key(ADMIN), hash_key(OTHER_ADMIN)))
    status, body = _admin(admin, "POST", "/admin/reload", ADMIN)
    assert status == 400, body
    assert body["error"]["code"] == "invalid_config"
    assert "auth.admin_token_sha256" in body["error"]["message"]
    assert _admin(admin, "GET", "/admin/rollout", ADMIN)[0] == 200
    assert _admin(admin, "GET", "/admin/rollout", OTHER_ADMIN)[0] == 401
    # A reload the workers take is still applied by all, the supervisor's key check with it.
    path.write_text(good.replace('tenant = "t"', 'tenant = "t2"'))
    status, body = _admin(admin, "POST", "/admin/reload", ADMIN)
    assert (status, body["generation"]) == (200, 1), body
    _until(
        lambda: _series(_metrics(admin), "router_config_generation") == [1.0, 1.0],
        "both workers at generation 1",
    )
    assert _admin(admin, "GET", "/admin/rollout", KEY)[0] == 403


@pytest.mark.timeout(120)
def test_a_key_listed_twice_is_refused_before_anything_changes(
    sim_region: SimFactory, router_proc: RouterFactory, tmp_path: Path
) -> None:
    router, region, admin = _keyed_machine(sim_region, router_proc)
    path = _config_path(router, tmp_path)
    good = path.read_text()
    # With [health] probing switched off in the same file: nothing of it may apply.
    twice = f'[[auth.keys]]\nsha256 = "{hash_key(KEY)}"\ntenant = "u"\n'
    broken = good.replace("interval_s = 0.2\n", "interval_s = 0.2\nenabled = false\n")
    path.write_text(broken.replace("[[regions]]", twice + "[[regions]]", 1))
    status, body = _admin(admin, "POST", "/admin/reload", ADMIN)
    assert status == 400, body
    assert body["error"]["code"] == "invalid_config"
    assert "listed twice" in body["error"]["message"]
    # The same by SIGHUP: logged as a rejection, no traceback, the supervisor still running.
    router.popen.send_signal(signal.SIGHUP)
    _until(lambda: router.output().count("config reload rejected") >= 2, "the SIGHUP rejected")
    assert "Traceback" not in router.output()
    assert router.popen.poll() is None
    before = _probes(region)
    _until(lambda: _probes(region) >= before + 3, "probing goes on")
    assert _series(_metrics(admin), "router_config_generation") == [0.0, 0.0]
    assert _admin(admin, "GET", "/admin/rollout", ADMIN)[0] == 200


@pytest.mark.timeout(120)
def test_sighups_while_a_worker_starts_neither_kill_it_nor_leave_it_behind(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router = router_proc(_aliased_config(sim_region("a"), MODEL))
    _all_serving(router, 2)
    victim = _children(router.popen.pid)[0]
    os.kill(victim, signal.SIGKILL)
    # Reloads while its successor starts (before its SIGHUP handler is installed).
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline and router.popen.poll() is None:
        router.popen.send_signal(signal.SIGHUP)
        time.sleep(0.25)
    _all_serving(router, 2)
    assert router.popen.poll() is None
    # Only the SIGKILL above cost a restart; none died of a SIGHUP.
    assert router.output().count("restarting it") == 1, router.output()
    reloads = router.output().count(" workers (generation ")
    assert reloads > 0
    # The new worker caught up with reloads made while it started: every worker is at the last.
    _until(
        lambda: (
            _series(_machine_metrics(router), "router_config_generation") == [float(reloads)] * 2
        ),
        f"both workers at generation {reloads}",
    )
