"""Pure pieces of the request-path wiring: passive region view, health adapter, usage parsing."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from router.observability.metrics import RegionState
from router.observability.telemetry import PassiveHealth, health_source, usage


def test_passive_health_flips_and_counts_ejections() -> None:
    passive = PassiveHealth(["a", "b"])
    assert passive.states() == [RegionState("a", None), RegionState("b", None)]
    passive.saw("a", reachable=True)
    passive.saw("a", reachable=False)
    passive.saw("a", reachable=False)  # still down: not a second ejection
    passive.saw("b", reachable=True)
    assert passive.states() == [RegionState("a", False, ejections=1), RegionState("b", True)]
    passive.saw("a", reachable=True)
    passive.saw("a", reachable=False)
    assert passive.states()[0] == RegionState("a", False, ejections=2)


@dataclass
class _Region:
    available: bool
    ewma_rtt_s: float | None
    ejections: int


@dataclass
class _Health:
    regions: dict[str, _Region]

    def snapshot(self) -> dict[str, _Region]:
        return self.regions


def test_health_source_reads_the_snapshot_each_time() -> None:
    health = _Health({"a": _Region(True, 0.003, 0)})
    source = health_source(health, in_flight={"a": 2}.__getitem__, queue_depth=lambda name: 5)
    assert list(source()) == [RegionState("a", True, 0.003, 2, 5, 0)]
    health.regions["a"] = _Region(False, None, 1)
    assert list(source()) == [RegionState("a", False, None, 2, 5, 1)]


def test_usage_of_whole_bodies_only() -> None:
    body = b'{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}'
    assert usage(web.Response(body=body)) == (12, 34)
    assert usage(web.Response(body=b'{"id":"x"}')) == (None, None)
    assert usage(web.Response(body=b'{"usage": nonsense')) == (None, None)
    assert usage(web.StreamResponse()) == (None, None)
