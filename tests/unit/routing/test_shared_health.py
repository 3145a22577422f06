"""The machine's health table and report channel: what the one prober publishes is what every
worker routes from, ages move on between images, a worker's reports eject for the machine, and
an operator's drain holds in every worker, a later one too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from router.config import HealthConfig, RegionConfig
from router.routing import shared_health
from router.routing.health import Health
from router.routing.machine_prober import MachineProber
from router.routing.selection import AdminState
from router.routing.shared_health import ReportSender, SharedHealth, TableReader, TableWriter

REGIONS = (
    RegionConfig(name="a", base_url="http://127.0.0.1:9/v1", models=("m",)),
    RegionConfig(name="b", base_url="http://127.0.0.1:9/v2", models=("m",)),
)
# No probing: these tests feed the prober's passive side only.
QUIET = HealthConfig(enabled=False, eject_after=3)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_image_reads_back_with_its_ages_grown(tmp_path: Path) -> None:
    path = str(tmp_path / "health.table")
    shared_health.create(path)
    writer = TableWriter(path)
    clock = Clock()
    reader = TableReader(path, clock)
    assert reader.image() is None
    assert reader.routing_view() == []
    source = Health(QUIET, REGIONS)
    source.report("a", "ok", ttft_s=0.25)
    writer.publish(True, source.prober.snapshot(), {"b": "drained"})
    image = reader.image()
    assert image is not None
    assert image.probing
    assert reader.admin() == {"b": "drained"}
    clock.now = image.at + 2.0
    rows = {row[0]: row for row in reader.routing_view()}
    native = {row[0]: row for row in source.prober.routing_view()}
    assert rows.keys() == {"a", "b"}
    assert rows["a"][:5] == native["a"][:5]
    native_age = native["a"][5]
    assert native_age is not None
    assert rows["a"][5] == pytest.approx(native_age + 2.0, abs=0.1)
    snapshot = reader.snapshot()["a"]
    assert snapshot.ewma_ttft_s == pytest.approx(0.25)
    assert snapshot.ttft_age_s == pytest.approx(rows["a"][5])
    # A new image replaces the old; the same one is not decoded again.
    assert reader.image() is image
    writer.publish(False, source.prober.snapshot(), {})
    assert reader.image() is not image
    assert not reader.probing()
    writer.close()
    reader.close()
    source.stop()


async def test_a_workers_reports_eject_the_region_for_every_worker(tmp_path: Path) -> None:
    table, reports = str(tmp_path / "health.table"), str(tmp_path / "health.sock")
    prober = MachineProber(QUIET, REGIONS, table, reports)
    await prober.start()
    workers = [Health(QUIET, REGIONS, machine=SharedHealth(table, reports)) for _ in range(2)]
    try:
        assert [c.available for c in workers[1].candidates(["a", "b"])] == [True, True]
        # Three connect failures seen by one worker (the machine's eject_after).
        for _ in range(3):
            workers[0].report("a", "connect_error")
        assert workers[0].machine is not None
        workers[0].machine.sender.flush()
        for _ in range(500):  # the datagram reaches the prober's reader within a loop turn
            if prober.received == 3:
                break
            await asyncio.sleep(0.01)
        assert prober.received == 3
        prober.publish()
        for worker in workers:
            available = {c.name: c.available for c in worker.candidates(["a", "b"])}
            assert available == {"a": False, "b": True}
            assert worker.snapshot()["a"].ejected
            assert worker.stats()["probing"] is False
        # A drain set through the supervisor holds in every worker, one started later too.
        prober.set_admin("b", AdminState.DRAINED)
        late = Health(QUIET, REGIONS, machine=SharedHealth(table, reports))
        workers.append(late)
        for worker in workers:
            assert worker.admin_state("b") is AdminState.DRAINED
            assert [c.admin for c in worker.candidates(["b"])] == [AdminState.DRAINED]
    finally:
        for worker in workers:
            assert worker.machine is not None
            worker.machine.close()
            worker.stop()
        await prober.close()


def test_reports_with_no_prober_to_take_them_are_dropped_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sender = ReportSender(str(tmp_path / "nobody.sock"))
    for _ in range(3):
        sender.report("a", "ok", None, 0.1, None)
        sender.flush()
    sender.close()
    assert sender.dropped == 3
    warnings = [r for r in caplog.records if r.name == "router.health"]
    assert [r.getMessage() for r in warnings] == [
        "health reports dropped: the machine's prober is not reachable (probes go on)"
    ]
