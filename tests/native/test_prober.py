"""The native health prober against real processes on 127.0.0.1: probes, flips, ejection, API."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from router.native import Prober, RegionHealth
from tests.integration.conftest import start_sim
from tests.support import Proc, free_port, spawn

FAST = {"interval_s": 0.1, "timeout_s": 0.5, "jitter": 0.1}
# Every setting with its documented default (router/_native.pyi).
DEFAULTS = {
    "interval_s": 1.0,
    "jitter": 0.1,
    "timeout_s": 0.8,
    "path": "/health",
    "fallback_path": "/v1/models",
    "expected_statuses": [],
    "healthy_after": 2,
    "unhealthy_after": 2,
    "ewma_alpha": 0.3,
    "window": 64,
    "eject_after": 5,
    "base_ejection_s": 5.0,
    "max_ejection_s": 60.0,
    "ca_file": None,
}


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def region(p: Prober, name: str) -> RegionHealth:
    return next(h for h in p.snapshot() if h.name == name)


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        Prober(interval_s=0.0)
    with pytest.raises(ValueError, match="timeout_s must be a finite number of seconds"):
        Prober(timeout_s=-1.0)
    with pytest.raises(ValueError, match="base_ejection"):
        Prober(base_ejection_s=10.0, max_ejection_s=1.0)
    p = Prober()
    with pytest.raises(ValueError, match="invalid region url"):
        p.upsert_region("a", "ftp://x")
    p.upsert_region("a", "http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="unknown outcome"):
        p.report("a", "meh")
    with pytest.raises(ValueError, match="jitter"):
        p.configure(jitter=1.5)
    assert not p.report("nope", "server_error")
    assert p.regions() == ["a"]


@pytest.mark.parametrize("key", ["interval_s", "timeout_s", "base_ejection_s", "max_ejection_s"])
@pytest.mark.parametrize("value", [86_400.5, 1.7e19, 1.8e19, float("inf"), float("nan")])
def test_times_are_finite_and_at_most_a_day(key: str, value: float) -> None:
    # Beyond Duration's range they used to panic in the prober (on a report, or in the probe
    # thread), past it they were "non-negative" errors; now one message names the bound.
    expected = rf"{key} must be a finite number of seconds from 0 to 86400, got"
    with pytest.raises(ValueError, match=expected):
        Prober(**{key: value})
    with pytest.raises(ValueError, match=expected):
        Prober().configure(**{key: value})


def test_a_day_long_ejection_is_reported_not_a_panic() -> None:
    p = Prober(base_ejection_s=86_400.0, max_ejection_s=86_400.0, eject_after=1)
    p.upsert_region("r", "http://127.0.0.1:9")
    assert p.report("r", "timeout")
    assert 86_000 < region(p, "r").ejected_for_s <= 86_400


def test_unprobed_region_is_available_and_passive_failures_eject() -> None:
    p = Prober(eject_after=3, base_ejection_s=30.0, max_ejection_s=60.0)
    p.upsert_region("a", "http://127.0.0.1:9")
    h = region(p, "a")
    assert h.available
    assert not h.probed
    assert h.ewma_rtt_s is None
    p.report("a", "ok", 0.001, 0.050, 0.200)
    assert [p.report("a", "server_error") for _ in range(3)] == [False, False, True]
    h = region(p, "a")
    assert h.ejected
    assert not h.available
    assert h.ejections == 1
    assert 29.0 < h.ejected_for_s <= 30.0
    assert h.ejected_until is not None
    assert h.ejected_until > time.time() + 29
    assert h.ewma_ttft_s == pytest.approx(0.05)
    assert h.ewma_total_s == pytest.approx(0.2)
    assert [e[:2] for e in p.take_events()] == [("a", "ejected")]


def test_routing_view_agrees_with_snapshot() -> None:
    p = Prober(eject_after=2)
    p.upsert_region("b", "http://127.0.0.1:9")
    p.upsert_region("a", "http://127.0.0.1:9")
    assert p.routing_view() == [
        ("a", True, True, None, None, None),
        ("b", True, True, None, None, None),
    ]
    p.report("a", "ok", 0.001, 0.050, 0.200)
    p.report("b", "server_error")
    p.report("b", "server_error")
    view = {v[0]: v for v in p.routing_view()}
    for h in p.snapshot():
        _, available, healthy, rtt, ttft, ttft_age = view[h.name]
        assert (available, healthy, rtt, ttft) == (
            h.available,
            h.healthy,
            h.ewma_rtt_s,
            h.ewma_ttft_s,
        )
        assert (ttft_age is None) == (h.ttft_age_s is None)
    assert view["a"][4] == pytest.approx(0.05)
    assert view["a"][5] is not None
    assert 0.0 <= view["a"][5] < 5.0
    assert not view["b"][1]


def test_live_region_probed_then_killed_then_restarted(tmp_path: Path) -> None:
    sim = start_sim(tmp_path, "a", rtt_ms=20)
    p = Prober(**FAST, unhealthy_after=2, healthy_after=2)
    p.upsert_region("a", sim.url + "/v1")
    p.start()
    try:
        wait_for(lambda: region(p, "a").probes >= 3)
        h = region(p, "a")
        assert h.available
        assert h.probed
        assert h.ewma_rtt_s is not None
        assert h.ewma_rtt_s >= 0.02
        assert h.rtt_p50_s is not None
        assert h.rtt_p95_s is not None
        assert h.rtt_p50_s <= h.rtt_p95_s
        sim.kill()
        killed = time.monotonic()
        wait_for(lambda: not region(p, "a").healthy)
        # Two failed probes at ~0.1 s intervals, with jitter and scheduling slack.
        assert time.monotonic() - killed < 2.0
        assert "connect" in (region(p, "a").last_error or "")
        restarted = spawn(sim.args, sim.port, tmp_path / "a-again.log")
        try:
            wait_for(lambda: region(p, "a").available)
        finally:
            restarted.kill()
        kinds = [e[1] for e in p.take_events()]
        assert kinds == ["healthy", "unhealthy", "healthy"]
    finally:
        p.stop()
    assert not p.running


def test_probe_falls_back_to_models_path(tmp_path: Path) -> None:
    # A plain static server: /health is a 404, /v1/models exists, like a llama.cpp-ish region.
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text('{"data": []}')
    port = free_port()
    srv: Proc = spawn(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "-d",
            str(tmp_path),
        ],
        port,
        tmp_path / "http.log",
    )
    p = Prober(**FAST)
    try:
        p.upsert_region("static", f"http://127.0.0.1:{port}/v1")
        p.start()
        wait_for(lambda: region(p, "static").probes >= 2)
        h = region(p, "static")
        assert h.available
        assert h.probe_failures == 0
        assert "GET /v1/models" in srv.output()
    finally:
        p.stop()
        srv.kill()


def test_expected_status_and_hot_reload_of_regions(tmp_path: Path) -> None:
    sim = start_sim(tmp_path, "b", fail_mode="503")
    p = Prober(**FAST)
    try:
        p.upsert_region("b", sim.url)
        p.start()
        wait_for(lambda: not region(p, "b").healthy)
        assert region(p, "b").last_error == "status 503"
        # Accepting 503 as healthy (configure keeps history and applies at the next round).
        p.configure(**FAST, expected_statuses=[503], healthy_after=1)
        wait_for(lambda: region(p, "b").healthy)
        # Re-pointing a region resets it; removing it stops its probes.
        p.upsert_region("b", "http://127.0.0.1:1")
        wait_for(lambda: not region(p, "b").healthy)
        assert p.remove_region("b")
        assert p.snapshot() == []
        assert not p.remove_region("b")
    finally:
        p.stop()
        sim.kill()


def test_ejected_region_is_reinstated_by_a_good_probe(tmp_path: Path) -> None:
    sim = start_sim(tmp_path, "c")
    p = Prober(**FAST, eject_after=2, base_ejection_s=0.3, max_ejection_s=5.0)
    try:
        p.upsert_region("c", sim.url)
        p.start()
        wait_for(lambda: region(p, "c").probed)
        p.report("c", "timeout")
        assert p.report("c", "connect_error")
        assert not region(p, "c").available
        wait_for(lambda: region(p, "c").available)
        assert region(p, "c").ejections == 1
    finally:
        p.stop()
        sim.kill()


def test_start_stop_are_idempotent_and_drop_stops() -> None:
    p = Prober(**FAST)
    p.upsert_region("x", "http://127.0.0.1:1")
    p.start()
    p.start()
    assert p.running
    wait_for(lambda: region(p, "x").probes >= 1)
    p.stop()
    p.stop()
    frozen = region(p, "x").probes
    time.sleep(0.3)
    assert region(p, "x").probes == frozen
    p.start()
    wait_for(lambda: region(p, "x").probes > frozen)
    # The last reference going away stops and joins the thread (Drop); it must not hang.
    p = Prober(**FAST)


def test_settings_are_the_stubs_keywords() -> None:
    p = Prober(**DEFAULTS)
    p.configure(**DEFAULTS)
    with pytest.raises(TypeError, match="unexpected keyword argument 'intervals'"):
        Prober(intervals=1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        p.configure(bogus=1)
    with pytest.raises(TypeError, match=r"^window: "):
        Prober(window="64")
    with pytest.raises(ValueError, match="must start with '/'"):
        p.upsert_region("a", "http://127.0.0.1:9", path="health")
    with pytest.raises(ValueError, match="printable ASCII"):
        p.upsert_region("a", "http://127.0.0.1:9", path="/health\r\nX-Evil: 1")
    with pytest.raises(ValueError, match=r"ca_file /nonexistent/ca\.pem"):
        Prober(ca_file="/nonexistent/ca.pem")
    assert p.regions() == []


class Routes(ThreadingHTTPServer):
    """An HTTP(S) server on 127.0.0.1 in a thread: a status per path (404 otherwise)."""

    daemon_threads = True

    def __init__(self, statuses: dict[str, int], tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.statuses = statuses
        self.seen: list[str] = []
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        port: int = self.server_address[1]
        return port

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gives up on the handshake is what the TLS tests are about."""

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join()


class _Handler(BaseHTTPRequestHandler):
    server: Routes

    def do_GET(self) -> None:
        self.server.seen.append(self.path)
        status = self.server.statuses.get(self.path, 404)
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


def make_ca(dir: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA made now by the openssl CLI: (certificate, key)."""
    cert, key = dir / f"{name}.pem", dir / f"{name}.key"
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN=router test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def make_server_cert(dir: Path, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 signed by `ca`: (certificate, key)."""
    cert, key, csr, ext = (dir / f"server.{x}" for x in ("pem", "key", "csr", "ext"))
    ext.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=localhost",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return cert, key


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA's certificate file, and a server context with a certificate it signed."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI (make system-deps)")
    ca = make_ca(tmp_path, "ca")
    cert, key = make_server_cert(tmp_path, ca)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ca[0], ctx


def test_https_region_status_is_checked_over_tls(
    pki: tuple[Path, ssl.SSLContext],
) -> None:
    ca_file, ctx = pki
    srv = Routes({"/health": 200, "/v1/models": 200}, tls=ctx)
    p = Prober(**FAST, ca_file=str(ca_file))
    try:
        p.upsert_region("by-name", f"https://localhost:{srv.port}/v1")
        p.upsert_region("by-ip", f"https://127.0.0.1:{srv.port}/v1")
        p.start()
        wait_for(lambda: all(h.probes >= 2 for h in p.snapshot()))
        for h in p.snapshot():
            assert h.available, h.last_error
            assert h.probe_failures == 0
            assert h.ewma_rtt_s is not None
        assert "/health" in srv.seen
        # A 503 over TLS is a failed probe, exactly as over plain HTTP.
        srv.statuses["/health"] = 503
        wait_for(lambda: not any(h.healthy for h in p.snapshot()))
        assert {h.last_error for h in p.snapshot()} == {"status 503"}
        assert "/v1/models" not in srv.seen
    finally:
        p.stop()
        srv.close()


def test_https_region_behind_an_unknown_ca_fails_with_a_tls_error(
    tmp_path: Path, pki: tuple[Path, ssl.SSLContext]
) -> None:
    _, ctx = pki
    other_ca, _ = make_ca(tmp_path, "other-ca")
    srv = Routes({"/health": 200}, tls=ctx)
    # Trusting another CA (or only the system store) must not let a self-signed chain pass.
    untrusting = [Prober(**FAST, ca_file=other_ca), Prober(**FAST)]
    try:
        for p in untrusting:
            p.upsert_region("a", f"https://localhost:{srv.port}")
            p.start()
        wait_for(lambda: all(region(p, "a").probed for p in untrusting))
        for p in untrusting:
            h = region(p, "a")
            assert not h.healthy
            assert (h.last_error or "").startswith("tls: invalid peer certificate"), h.last_error
            assert "UnknownIssuer" in (h.last_error or "")
        assert srv.seen == []
    finally:
        for p in untrusting:
            p.stop()
        srv.close()


def test_region_probe_path_overrides_the_global_path() -> None:
    # A llama-server-like region: its own /health is 404 here, /live is its health route.
    srv = Routes({"/live": 200, "/v1/models": 200})
    p = Prober(**FAST)
    try:
        p.upsert_region("own", f"http://127.0.0.1:{srv.port}/v1", path="/live")
        p.upsert_region("strict", f"http://127.0.0.1:{srv.port}", path="/health")
        p.start()
        wait_for(lambda: all(h.probes >= 2 for h in p.snapshot()))
        own, strict = region(p, "own"), region(p, "strict")
        assert own.available
        assert own.probe_path == "/live"
        # A region's own path has no fallback: its 404 is a failure.
        assert not strict.healthy
        assert strict.last_error == "status 404"
        assert "/v1/models" not in srv.seen
        # Dropping the region's path goes back to the global one, with its 404 fallback.
        p.upsert_region("strict", f"http://127.0.0.1:{srv.port}")
        wait_for(lambda: region(p, "strict").healthy)
        assert region(p, "strict").probe_path == "/v1/models"
    finally:
        p.stop()
        srv.close()
