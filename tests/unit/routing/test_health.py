"""Health (prober not started, so no sockets): candidates, staleness, admin state, stats."""

from __future__ import annotations

import random
import time

import pytest

from router.config import HealthConfig, RegionConfig, RoutingConfig
from router.errors import ConfigError
from router.routing.health import Health
from router.routing.selection import AdminState


def regions(*names: str) -> list[RegionConfig]:
    return [
        RegionConfig(name=n, base_url=f"http://127.0.0.1:{9 + i}/v1", models=("m",), bias_ms=i)
        for i, n in enumerate(names)
    ]


def test_passive_ttft_counts_until_stale() -> None:
    h = Health(HealthConfig(ttft_stale_s=0.05), regions("a", "b"), rng=random.Random(0))
    routing = RoutingConfig(tolerance_ms=0)
    h.report("b", "ok", ttft_s=0.05)
    h.report("a", "ok", ttft_s=0.2)
    a, b = h.candidates(["a", "b"])
    assert (a.ewma_ttft_s, b.ewma_ttft_s) == (pytest.approx(0.2), pytest.approx(0.05))
    assert (a.bias_s, b.bias_s) == (0.0, 0.001)
    assert h.select(["a", "b"], routing).names == ["b", "a"]
    time.sleep(0.1)
    h.report("a", "ok", ttft_s=0.2)
    # b's one fast answer is old news: it no longer counts, b scores like the best measured.
    assert h.candidates(["b"])[0].ewma_ttft_s is None
    assert h.select(["a", "b"], routing).names == ["a", "b"]


def test_admin_states_exclude_regions_and_show_in_stats() -> None:
    h = Health(HealthConfig(), regions("a", "b"))
    assert h.set_admin("a", AdminState.DRAINED)
    assert not h.set_admin("zzz", AdminState.DRAINED)
    assert h.select(["a", "b"], RoutingConfig()).names == ["b"]
    assert h.any_available()
    h.set_admin("b", AdminState.DISABLED)
    assert not h.any_available()
    assert h.select(["a", "b"], RoutingConfig()).names == []
    stats = h.stats()
    assert stats["probing"] is False
    assert [(r["name"], r["admin"]) for r in stats["regions"]] == [
        ("a", "drained"),
        ("b", "disabled"),
    ]


def test_set_regions_adds_and_forgets() -> None:
    h = Health(HealthConfig(), regions("a", "b"))
    h.set_regions(regions("b", "c"))
    assert sorted(h.snapshot()) == ["b", "c"]
    assert h.admin_state("a") is None
    assert h.admin_state("c") is AdminState.ACTIVE


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"\[health\]"):
        Health(HealthConfig(base_ejection_s=10.0, max_ejection_s=1.0), regions("a"))
    bad = [RegionConfig(name="x", base_url="http://h:notaport", models=("m",))]
    with pytest.raises(ConfigError, match=r"regions\.x\.base_url"):
        Health(HealthConfig(), bad)
