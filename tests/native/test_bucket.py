"""router.BucketTable: limits, acquire, reconcile, refund, expiry, errors."""

from __future__ import annotations

import math
import threading

import pytest

import router


def table(rpm: float = 60, tpm: float = 600, **bursts: float) -> router.BucketTable:
    t = router.BucketTable(shards=8)
    t.set_limits("k", requests_per_minute=rpm, tokens_per_minute=tpm, **bursts)
    return t


def test_acquire_takes_from_both_or_neither() -> None:
    t = table()
    allowed, retry, rem_req, rem_tok, reset_req, reset_tok = t.try_acquire("k", 500)
    assert allowed
    assert retry == 0.0
    assert (rem_req, rem_tok) == (59, 100)
    assert 0 < reset_req <= 1.0
    assert 0 < reset_tok <= 50.0
    allowed, retry, rem_req, rem_tok, _, _ = t.try_acquire("k", 200)
    assert not allowed
    assert 0 < retry <= 10.0
    assert rem_req == 59
    assert rem_tok >= 100


def test_request_bucket_runs_out() -> None:
    t = table(rpm=3, tpm=1000)
    assert [t.try_acquire("k")[0] for _ in range(4)] == [True, True, True, False]


def test_more_than_capacity_is_refused_with_infinite_retry() -> None:
    t = table(tpm=600, token_burst=100)
    allowed, retry, *_ = t.try_acquire("k", 101)
    assert not allowed
    assert math.isinf(retry)
    zero = table(rpm=0)
    assert math.isinf(zero.try_acquire("k")[1])


def test_set_limits_again_keeps_levels_clamped() -> None:
    t = table(rpm=60, tpm=600)
    assert t.try_acquire("k", 550)[0]
    t.set_limits("k", requests_per_minute=10, tokens_per_minute=60)
    _, _, rem_req, rem_tok, _, _ = t.try_acquire("k", 0)
    assert rem_req == 9
    assert rem_tok <= 60
    assert len(t) == 1


def test_reconcile_gives_back_and_takes_debt() -> None:
    t = table(rpm=60, tpm=600)
    assert t.try_acquire("k", 500)[0]
    t.reconcile("k", 500, 100)
    assert t.try_acquire("k", 0)[3] >= 500
    t.reconcile("k", 0, 2000)
    allowed, retry, _, rem_tok, _, _ = t.try_acquire("k", 1)
    assert not allowed
    assert rem_tok == 0
    assert retry > 60.0


def test_refund_is_capped() -> None:
    t = table(rpm=2, tpm=100)
    assert t.try_acquire("k", 10)[0]
    t.refund("k", requests=5, tokens=1000)
    _, _, rem_req, rem_tok, _, _ = t.try_acquire("k", 0)
    assert rem_req == 1
    assert rem_tok == 100


def test_unknown_key_is_key_error() -> None:
    t = table()
    with pytest.raises(KeyError):
        t.try_acquire("nope")
    with pytest.raises(KeyError):
        t.reconcile("nope", 1, 1)
    with pytest.raises(KeyError):
        t.refund("nope")


def test_expire_idle_drops_only_full_idle_keys() -> None:
    t = router.BucketTable()
    for i in range(100):
        t.set_limits(f"k{i}", requests_per_minute=60, tokens_per_minute=60)
    assert t.try_acquire("k0", 0)[0]
    assert t.expire_idle(3600.0) == 0
    # k0 is not full again for about a second; every other key is full and idle >= 0 s.
    assert t.expire_idle(0.0) == 99
    assert len(t) == 1


def test_bad_arguments() -> None:
    with pytest.raises(router.InvalidArgumentError, match="shards"):
        router.BucketTable(shards=0)
    t = router.BucketTable()
    with pytest.raises(router.InvalidArgumentError, match="requests_per_minute"):
        t.set_limits("k", requests_per_minute=float("nan"), tokens_per_minute=1)
    with pytest.raises(router.InvalidArgumentError, match="token_burst"):
        t.set_limits("k", requests_per_minute=1, tokens_per_minute=1, token_burst=-1)
    with pytest.raises(router.InvalidArgumentError, match="idle_seconds"):
        t.expire_idle(float("inf"))
    with pytest.raises(OverflowError):
        table().try_acquire("k", -1)
    assert len(t) == 0


def test_threads_never_overdraw() -> None:
    t = router.BucketTable(shards=4)
    t.set_limits("k", requests_per_minute=0.001, tokens_per_minute=1e9, request_burst=1000)
    wins = [0] * 4

    def worker(i: int) -> None:
        for _ in range(500):
            if t.try_acquire("k", 1)[0]:
                wins[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(wins) == 1000
