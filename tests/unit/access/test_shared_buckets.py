"""The workers' shared rate-limit table: one file, several mappers, the BucketTable's answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.access.shared_buckets import SharedBucketTable, create
from router.native import BucketTable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def path(tmp_path: Path) -> str:
    file = str(tmp_path / "limits.table")
    create(file)
    return file


def test_two_workers_draw_from_one_bucket(path: str) -> None:
    clock = Clock()
    a, b = SharedBucketTable(path, 0, clock), SharedBucketTable(path, 1, clock)
    for table in (a, b):
        table.set_limits("k", requests_per_minute=60, tokens_per_minute=600, request_burst=10)
    taken = [(a if i % 2 else b).try_acquire("k", 10)[0] for i in range(12)]
    assert taken == [True] * 10 + [False] * 2
    allowed, retry, rem_r, rem_t, reset_r, _ = b.try_acquire("k")
    assert (allowed, rem_r, rem_t) == (False, 0, 500)
    assert retry == pytest.approx(1.0)
    assert reset_r == pytest.approx(10.0)
    clock.now += 1.0  # one request a second refills
    assert a.try_acquire("k")[0] is True


def test_same_answers_as_the_native_table(path: str) -> None:
    clock = Clock()
    shared = SharedBucketTable(path, 0, clock)
    native = BucketTable()
    for table in (shared, native):
        table.set_limits("k", requests_per_minute=60, tokens_per_minute=600)
    for tokens in (500, 200, 50):
        mine, theirs = shared.try_acquire("k", tokens), native.try_acquire("k", tokens)
        assert mine[0] == theirs[0]
        assert mine[2:4] == theirs[2:4]
        assert mine[1] == pytest.approx(theirs[1], abs=0.05)
    shared.reconcile("k", 550, 50)
    native.reconcile("k", 550, 50)
    assert shared.try_acquire("k", 0)[3] == native.try_acquire("k", 0)[3]


def test_set_limits_again_keeps_levels_and_unknown_keys_raise(path: str) -> None:
    clock = Clock()
    a = SharedBucketTable(path, 0, clock)
    a.set_limits("k", requests_per_minute=60, tokens_per_minute=600, request_burst=2)
    assert a.try_acquire("k")[0]
    # A worker (re)starting installs the same limits: the level is not refilled.
    SharedBucketTable(path, 1, clock).set_limits(
        "k", requests_per_minute=60, tokens_per_minute=600, request_burst=2
    )
    assert a.try_acquire("k")[0]
    assert not a.try_acquire("k")[0]
    with pytest.raises(KeyError):
        a.try_acquire("other")


def test_in_flight_is_counted_for_the_machine(path: str) -> None:
    a, b = SharedBucketTable(path, 0), SharedBucketTable(path, 1)
    assert a.enter("k", 3)
    assert b.enter("k", 3)
    assert b.enter("k", 3)
    assert not a.enter("k", 3)
    assert a.in_flight("k") == 3
    b.leave("k")
    assert a.enter("k", 3)
    # Worker 1 dies and is restarted: its own count (1 left) is cleared, worker 0's stays.
    SharedBucketTable(path, 1)
    assert a.in_flight("k") == 2
