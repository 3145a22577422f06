"""`router serve --workers N` as real processes: the workers serve one port, a killed worker
is restarted at its siblings' config generation, SIGHUP reloads all, the admin listener and the
client listener's /metrics show the whole machine, one prober probes for the machine, limits
and admission caps hold for the machine, SIGTERM stops everything, and workers whose supervisor
was killed outright leave too."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import (
    MODEL,
    RouterFactory,
    SimFactory,
    region_toml,
    regions_toml,
    sim_stats,
)
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


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.timeout(60)
def test_workers_leave_when_their_supervisor_is_killed(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router = router_proc(regions_toml(sim_region("a"), header="[server]\nworkers = 2\n"))
    _until(lambda: len(_children(router.popen.pid)) == 2, "two workers")
    _all_serving(router, 2)
    workers = _children(router.popen.pid)
    args = Path(f"/proc/{workers[0]}/cmdline").read_bytes().split(b"\0")
    machine_dir = Path(args[args.index(b"--machine-dir") + 1].decode())
    assert machine_dir.is_dir()
    # SIGKILL: no drain, no signal to the workers from the supervisor itself.
    router.kill(signal.SIGKILL)
    # They drain (nothing in flight) and exit, and the port is free for the next supervisor;
    # the supervisor's private directory does not pile up in /tmp either.
    _until(lambda: not any(_running(pid) for pid in workers), "the workers gone")
    assert not _accepts(router.port)
    assert not machine_dir.exists()


@pytest.mark.timeout(60)
def test_workers_dying_as_they_start_stop_the_supervisor_with_exit_1(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router = router_proc(regions_toml(sim_region("a"), header="[server]\nworkers = 2\n"))
    _until(lambda: len(_children(router.popen.pid)) == 2, "two workers")
    # Every worker killed as soon as it is there: five deaths within 5 s of starting, in a row.
    deadline = time.monotonic() + 40
    while router.popen.poll() is None and time.monotonic() < deadline:
        for pid in _children(router.popen.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    assert router.popen.wait(timeout=10) == 1
    assert "times within 5s of starting" in router.output()
    assert "giving up" in router.output()


def two_workers(sim_region: SimFactory, router_proc: RouterFactory) -> tuple[Proc, int]:
    """A supervisor with 2 workers in front of sim region `a`, both started, and the port of
    its admin listener (the machine's /metrics and /admin)."""
    admin = free_port()
    header = f'[server]\nadmin_listen = "127.0.0.1:{admin}"\nworkers = 2\n'
    router = router_proc(regions_toml(sim_region("a"), header=header))
    wait_for_port(admin, proc=router.popen)
    _until(lambda: len(_children(router.popen.pid)) == 2, "two workers")
    for _ in range(2):
        wait_for_port(router.port, proc=router.popen)
    return router, admin


@pytest.mark.timeout(120)
def test_two_workers_share_the_port_restart_reload_and_stop(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router, admin = two_workers(sim_region, router_proc)
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


def _probes(region: Proc) -> int:
    probes: int = sim_stats(region)["probes"]
    return probes


def _probe_rate_bound(region: Proc, interval_s: float, window_s: float) -> tuple[int, int]:
    """(probes `region` received over about `window_s`, the most one prober without jitter
    sends in the time that really passed): probes are never early, only late, so one prober
    stays under the bound whatever the load, and two would be near twice it."""
    before, start = _probes(region), time.monotonic()
    time.sleep(window_s)
    after, elapsed = _probes(region), time.monotonic() - start
    return after - before, int(elapsed / interval_s) + 2


def _machine_metrics(router: Proc) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return _metrics(router.port)


def _all_serving(router: Proc, workers: int) -> None:
    """Wait until every worker answers the supervisor (its client listener is bound before)."""

    def serving() -> bool:
        try:
            m = _machine_metrics(router)
        except OSError:  # no worker listening yet
            return False
        return len(_series(m, "router_config_generation")) == workers

    _until(serving, f"{workers} workers serving", timeout=40.0)


@pytest.mark.timeout(150)
def test_one_prober_for_the_machine_through_restarts_and_reloads(
    sim_region: SimFactory, router_proc: RouterFactory, tmp_path: Path
) -> None:
    region = sim_region("a")
    health = "[health]\ninterval_s = {interval}\njitter = 0.0\n"
    config = regions_toml(region, header="[server]\nworkers = 3\n" + health.format(interval=0.2))
    router = router_proc(config)
    _until(lambda: len(_children(router.popen.pid)) == 3, "three workers")
    _all_serving(router, 3)

    # Three workers, one prober: the region sees the probe rate of one (3x it before).
    probes, bound = _probe_rate_bound(region, 0.2, 3.0)
    assert 0 < probes <= bound, (probes, bound)
    # Every worker routes from the same table: each sees the region probed and healthy.
    m = _machine_metrics(router)
    assert sorted(v for (n, labels), v in m.items() if n == "router_region_healthy") == [1.0] * 3

    # A worker killed outright: probing neither stops nor doubles while it is replaced.
    victim = _children(router.popen.pid)[0]
    os.kill(victim, signal.SIGKILL)
    router.wait_output("restarting it")
    _until(
        lambda: len(_children(router.popen.pid)) == 3 and victim not in _children(router.popen.pid),
        "a new worker",
    )
    _all_serving(router, 3)
    probes, bound = _probe_rate_bound(region, 0.2, 2.0)
    assert 0 < probes <= bound, (probes, bound)

    # A reload that slows probing down applies once, to the one prober.
    path = tmp_path / f"router-{router.port}.toml"
    path.write_text(path.read_text().replace("interval_s = 0.2", "interval_s = 0.5"))
    router.popen.send_signal(signal.SIGHUP)
    router.wait_output("by 3 workers (generation 1)")
    probes, bound = _probe_rate_bound(region, 0.5, 3.0)
    assert 0 < probes <= bound, (probes, bound)
    assert [_chat(router) for _ in range(5)] == [200] * 5


def _routed(router: Proc) -> tuple[int, str, str]:
    """A chat request on a fresh connection: status, x-router-region, x-router-attempts."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(
        router.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Connection": "close"},
    )
    with urllib.request.urlopen(req, timeout=20) as resp:
        return resp.status, resp.headers["x-router-region"], resp.headers["x-router-attempts"]


@pytest.mark.timeout(120)
def test_a_killed_region_is_seen_by_every_worker(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    near, far = sim_region("near"), sim_region("far")
    header = "[server]\nworkers = 2\n[health]\ninterval_s = 0.2\n"
    config = (
        header + "[auth]\nenabled = false\n" + region_toml(near) + region_toml(far, bias_ms=200)
    )
    router = router_proc(config)
    _until(lambda: len(_children(router.popen.pid)) == 2, "two workers")
    _all_serving(router, 2)
    assert {_routed(router) for _ in range(10)} == {(200, "near", "1")}

    near.kill()  # SIGKILL: no goodbye, connections refused from now on

    def everyone_knows() -> bool:
        m = _machine_metrics(router)
        seen = [
            v
            for (n, labels), v in m.items()
            if n == "router_region_healthy" and ("region", "near") in labels
        ]
        return seen == [0.0, 0.0]

    _until(everyone_knows, "both workers see the dead region")
    # New connections spread over both workers: none tries the dead region first.
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _routed(router), range(40)))
    assert answers == [(200, "far", "1")] * 40


@pytest.mark.timeout(120)
def test_client_port_metrics_answer_for_the_machine(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router = router_proc(regions_toml(sim_region("a"), header="[server]\nworkers = 2\n"))
    _until(lambda: len(_children(router.popen.pid)) == 2, "two workers")
    _all_serving(router, 2)
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda _: _routed(router)[0], range(30)))
    assert statuses == [200] * 30
    # Every scrape, whichever worker takes its connection, counts the machine's requests.
    for _ in range(6):
        m = _machine_metrics(router)
        assert sum(_series(m, "router_requests_total")) == 30
        assert len(_series(m, "router_config_generation")) == 2
    with urllib.request.urlopen(router.url + "/status.json", timeout=10) as resp:
        status = json.loads(resp.read())
    assert status["workers"] == 2
    assert status["overall"]["requests"] == 30


def _status_of(router: Proc) -> int:
    try:
        return _routed(router)[0]
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.timeout(120)
def test_admission_caps_hold_for_the_machine(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    slow = sim_region("a", ttft_ms=1500)
    header = (
        "[server]\nworkers = 2\n[admission]\nmax_in_flight = 2\nqueue_size = 1\nmax_wait_s = 10\n"
    )
    router = router_proc(regions_toml(slow, header=header))
    _all_serving(router, 2)
    # Eight at once on fresh connections (spread over both workers): two run, one waits for
    # the first free slot, five find the machine's slots and queue full.
    with ThreadPoolExecutor(8) as pool:
        statuses = sorted(pool.map(lambda _: _status_of(router), range(8)))
    assert statuses == [200] * 3 + [503] * 5
    assert sim_stats(slow)["requests"] == 3
    m = _machine_metrics(router)
    assert sum(_series(m, "router_region_in_flight")) == 0
    assert sum(_series(m, "router_region_queue_depth")) == 0


ADMIN = "admin-workers-0123456789"


@pytest.mark.timeout(120)
def test_a_drain_on_the_client_port_holds_in_every_worker_after_a_restart(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    from router.access.auth import hash_key

    near, far = sim_region("near"), sim_region("far")
    config = (
        "[server]\nworkers = 2\n"
        f'[auth]\nenabled = false\nadmin_token_sha256 = "{hash_key(ADMIN)}"\n'
        + region_toml(near)
        + region_toml(far, bias_ms=200)
    )
    router = router_proc(config)
    _all_serving(router, 2)
    # Without admin_listen the client port's /admin/* goes to the supervisor, which has every
    # worker apply it and keeps it for the machine.
    req = urllib.request.Request(
        router.url + "/admin/regions/near/drain",
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["X-Router-Workers"] == "2/2"
    victim = _children(router.popen.pid)[0]
    os.kill(victim, signal.SIGKILL)
    router.wait_output("restarting it")
    _until(lambda: victim not in _children(router.popen.pid), "the dead worker reaped")
    _all_serving(router, 2)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _routed(router), range(20)))
    assert answers == [(200, "far", "1")] * 20


def test_stored_responses_are_pinned_whichever_worker_takes_the_follow_up(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    """The machine's workers share which region holds each stored response: follow-ups on
    fresh connections (spread over the workers) all go to the region that made it."""
    import openai

    a, b = sim_region("a"), sim_region("b")
    config = "[server]\nworkers = 2\n[auth]\nenabled = false\n"
    router = router_proc(config + region_toml(a) + region_toml(b, bias_ms=500))
    _all_serving(router, 2)
    made_ids = []
    for i in range(4):
        with openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
            made = client.responses.create(
                model=MODEL,
                input=f"keep {i}",
                extra_headers={"x-sim-fail": "503", "x-sim-only": "a"},
            )
            made_ids.append(made.id)
    regions = set()
    for made_id in made_ids * 3:
        # A new client, a new connection: either worker may take it.
        with openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
            follow = client.responses.with_raw_response.create(
                model=MODEL, input="more", previous_response_id=made_id
            )
            regions.add(follow.headers["x-router-region"])
            assert client.responses.retrieve(made_id).id == made_id
    assert regions == {"b"}


def _raw(port: int, head: str, body: bytes = b"") -> tuple[str, dict[str, str], bytes]:
    """One request on a fresh connection; the answer's status line, headers and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        top, _, rest = data.partition(b"\r\n\r\n")
        status, *fields = top.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
        while len(rest) < int(headers.get("content-length", "0")):
            chunk = sock.recv(65536)
            assert chunk, rest
            rest += chunk
    return status, headers, rest


@pytest.mark.timeout(90)
def test_the_admin_listener_checks_the_token_first_and_answers_in_openais_shape(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    from router.access.auth import hash_key

    admin = free_port()
    config = (
        f'[server]\nadmin_listen = "127.0.0.1:{admin}"\nworkers = 2\n'
        f'[auth]\nadmin_token_sha256 = "{hash_key(ADMIN)}"\n'
        f'[[auth.keys]]\nsha256 = "{hash_key(KEY)}"\ntenant = "t"\n' + region_toml(sim_region("a"))
    )
    router = router_proc(config)
    wait_for_port(admin, proc=router.popen)
    _until(lambda: len(_children(router.popen.pid)) == 2, "two workers")
    drain = "POST /admin/regions/a/drain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    # A megabyte announced and never sent: refused on its headers, no worker asked.
    for auth, code in (("", "401"), (f"Authorization: Bearer {KEY}\r\n", "403")):
        status, headers, body = _raw(admin, f"{drain}{auth}Content-Length: 1048576\r\n\r\n")
        assert status.split()[1] == code, (status, body)
        assert headers["content-type"].startswith("application/json")
        assert "x-router-workers" not in headers
        assert json.loads(body)["error"]["message"]
    # With the token, too large a body is a 413 in OpenAI's shape, an unknown path a 404.
    token = f"Authorization: Bearer {ADMIN}\r\n"
    status, headers, body = _raw(
        admin, f"{drain}{token}Content-Length: {2 << 20}\r\n\r\n", b"x" * (2 << 20)
    )
    assert status.split()[1] == "413", status
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    status, headers, body = _raw(
        admin, "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status.split()[1] == "404", status
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["code"] == "not_found"
    # The token holder's call still reaches every worker.
    _all_serving_admin(admin, 2)
    status, headers, body = _raw(admin, f"{drain}{token}Content-Length: 0\r\n\r\n")
    assert status.split()[1] == "200", (status, body)
    assert headers["x-router-workers"] == "2/2"


def _all_serving_admin(admin: int, workers: int) -> None:
    _until(
        lambda: len(_series(_metrics(admin), "router_config_generation")) == workers,
        f"{workers} workers serving",
        timeout=40.0,
    )
