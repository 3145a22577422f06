"""The native health prober against real processes on 127.0.0.1: probes, flips, ejection, API."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from router.native import Prober, RegionHealth
from tests.integration.conftest import start_sim
from tests.support import Proc, free_port, spawn

FAST = {"interval_s": 0.1, "timeout_s": 0.5, "jitter": 0.1}


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
    with pytest.raises(ValueError, match="non-negative"):
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
