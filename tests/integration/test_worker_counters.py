"""The machine's /metrics under `--workers 2`: a worker killed and restarted takes nothing
away from the summed counters (a sum that went down would read as a counter reset)."""

from __future__ import annotations

import os
import signal

import pytest

from tests.integration.conftest import RouterFactory, SimFactory
from tests.integration.test_workers import (
    _chat,
    _children,
    _metrics,
    _series,
    _until,
    two_workers,
)


@pytest.mark.timeout(120)
def test_counters_keep_what_a_dead_worker_counted(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router, admin = two_workers(sim_region, router_proc)
    assert [_chat(router) for _ in range(20)] == [200] * 20
    _until(lambda: sum(_series(_metrics(admin), "router_requests_total")) == 20, "20 counted")
    seen = _metrics(admin)
    assert min(_series(seen, "router_requests_total")) > 0  # both workers took some

    victim = _children(router.popen.pid)[0]
    os.kill(victim, signal.SIGKILL)
    router.wait_output("restarting it")
    # While it is gone and once its successor answers, the sums stay where they were.
    assert sum(_series(_metrics(admin), "router_requests_total")) == 20
    _until(
        lambda: len(_children(router.popen.pid)) == 2 and victim not in _children(router.popen.pid),
        "a new worker",
    )
    _until(lambda: len(_series(_metrics(admin), "router_config_generation")) == 2, "it answers")
    m = _metrics(admin)
    assert sum(_series(m, "router_requests_total")) == 20
    # Histograms too (their counts and buckets), and the new requests add to what was there.
    ttft = "router_ttft_seconds_count"
    assert sum(_series(m, ttft)) == sum(_series(seen, ttft))
    assert [_chat(router) for _ in range(10)] == [200] * 10
    _until(lambda: sum(_series(_metrics(admin), "router_requests_total")) == 30, "30 counted")
    # Gauges of the dead worker are not kept: one generation series per live worker.
    assert len(_series(_metrics(admin), "router_config_generation")) == 2
