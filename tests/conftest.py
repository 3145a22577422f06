"""Fixtures shared by every test directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Proc, start_redis


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[Proc]:
    """A fresh real redis-server for one test; killed afterwards."""
    proc = start_redis(tmp_path)
    yield proc
    proc.kill()
