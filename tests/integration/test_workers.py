"""`router serve --workers 2` as real processes: both workers serve one port, a killed worker
is restarted at its siblings' config generation, SIGHUP reloads all, the admin listener shows
the whole machine, SIGTERM stops everything."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL, RouterFactory, SimFactory, regions_toml
from tests.support import Proc, free_port, wait_for_port


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _metrics(admin: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _series(m: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> list[float]:
    return [v for (n, _), v in m.items() if n == name]


def _chat(router: Proc) -> int:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(
        router.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        status: int = resp.status
        return status


def _until(check: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_two_workers_share_the_port_restart_reload_and_stop(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    admin = free_port()
    header = f'[server]\nadmin_listen = "127.0.0.1:{admin}"\nworkers = 2\n'
    router = router_proc(regions_toml(sim_region("a"), header=header))
    wait_for_port(admin, proc=router.popen)
    _until(lambda: len(_children(router.popen.pid)) == 2, "two workers")
    for _ in range(2):
        wait_for_port(router.port, proc=router.popen)
    assert [_chat(router) for _ in range(20)] == [200] * 20

    # The admin listener is the machine: every worker's requests, both workers' views.
    def counted() -> bool:
        m = _metrics(admin)
        # Both workers answer the supervisor (each has its own generation series).
        return (
            sum(_series(m, "router_requests_total")) == 20
            and _series(m, "router_workers") == [2.0]
            and len(_series(m, "router_config_generation")) == 2
        )

    _until(counted, "20 requests over 2 workers in /metrics")
    m = _metrics(admin)
    assert _series(m, "router_config_generation") == [0.0, 0.0]
    assert _series(m, "process_resident_memory_bytes")[0] > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=10) as resp:
        assert resp.headers["Server"] == "router"
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/status.json", timeout=10) as resp:
        status = json.loads(resp.read())
    assert status["workers"] == 2
    assert status["overall"]["requests"] == 20

    # SIGHUP: checked once, applied by both.
    router.popen.send_signal(signal.SIGHUP)
    router.wait_output("by 2 workers (generation 1)")
    _until(
        lambda: _series(_metrics(admin), "router_config_generation") == [1.0, 1.0],
        "both workers at generation 1",
    )

    # A worker killed outright is replaced, at generation 1 like its sibling.
    victim = _children(router.popen.pid)[0]
    os.kill(victim, signal.SIGKILL)
    router.wait_output("restarting it")
    _until(
        lambda: len(_children(router.popen.pid)) == 2 and victim not in _children(router.popen.pid),
        "a new worker",
    )
    _until(
        lambda: (
            _series(_metrics(admin), "router_config_generation") == [1.0, 1.0]
            and _series(_metrics(admin), "router_worker_restarts_total") == [1.0]
        ),
        "the new worker at generation 1",
    )
    assert [_chat(router) for _ in range(10)] == [200] * 10

    # SIGTERM: the supervisor drains every worker and exits cleanly.
    workers = _children(router.popen.pid)
    router.popen.send_signal(signal.SIGTERM)
    assert router.popen.wait(timeout=60) == 0
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


KEY = "sk-workers-0123456789abcdef"


def _keyed(router: Proc) -> int:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(
        router.url + "/v1/chat/completions",
        data=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {KEY}",
            "Connection": "close",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.timeout(120)
def test_limits_are_exact_across_workers(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    from router.access.auth import hash_key

    slow = sim_region("a", ttft_ms=1500)
    header = (
        "[server]\nworkers = 2\n[auth]\n[[auth.keys]]\n"
        f'sha256 = "{hash_key(KEY)}"\ntenant = "t"\n'
        "requests_per_minute = 6\nrequest_burst = 6\nmax_concurrent = 2\n"
    )
    router = router_proc(regions_toml(slow, header=header))
    _until(lambda: len(_children(router.popen.pid)) == 2, "two workers")
    time.sleep(1.0)  # both workers listening (each binds once started)
    # Six at once on fresh connections (spread over both workers): two run, four are refused.
    with ThreadPoolExecutor(6) as pool:
        first = sorted(pool.map(lambda _: _keyed(router), range(6)))
    assert first == [200, 200, 429, 429, 429, 429]
    # The bucket held 6 requests for the machine; 2 went, so 4 more pass, one by one.
    later = [_keyed(router) for _ in range(8)]
    assert later == [200] * 4 + [429] * 4
