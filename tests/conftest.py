"""Fixtures shared by every test directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Proc, RedisClusterProcs, start_redis, start_redis_cluster


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[Proc]:
    """A fresh real redis-server for one test; killed afterwards."""
    proc = start_redis(tmp_path)
    yield proc
    proc.kill()


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisClusterProcs]:
    """A fresh real three-master Redis Cluster, one replica each; killed afterwards."""
    cluster = start_redis_cluster(tmp_path)
    yield cluster
    cluster.kill()
