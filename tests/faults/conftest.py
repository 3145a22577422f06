"""Fault-suite fixtures: the integration fixtures plus deliberately broken regions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import router_proc, sim_region
from tests.support import Proc, free_port, spawn

__all__ = ["bad_upstream", "router_proc", "sim_region"]

BadFactory = Callable[[str], Proc]


@pytest.fixture
def bad_upstream(tmp_path: Path) -> Iterator[BadFactory]:
    """Factory: bad_upstream(mode) starts tests/faults/bad_upstream.py in that mode."""
    procs: list[Proc] = []

    def start(mode: str) -> Proc:
        port = free_port()
        args = ["python", "-m", "tests.faults.bad_upstream", "--port", str(port), "--mode", mode]
        proc = spawn(args, port, tmp_path / f"bad-{mode}-{port}.log")
        proc.name = f"bad-{mode}"  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
