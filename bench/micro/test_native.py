"""Native hot path vs the pure-Python reference, side by side; every benchmark checks its answer.

CPU time (time.process_time) is the timer: the bench machine is shared, and wall time would
mostly measure the other tenants.
"""

from __future__ import annotations

import random
import time

import pytest
from pytest_benchmark.fixture import BenchmarkFixture
from tests import reference
from tests.reference import chat_request, prompt_text

import router

BODY = chat_request()
PROMPT = prompt_text()
cpu = pytest.mark.benchmark(timer=time.process_time)


@cpu
def test_fingerprint_normalized_rust(benchmark: BenchmarkFixture) -> None:
    key = benchmark(router.fingerprint, BODY, level="normalized")
    assert len(key) == 16
    assert router.canonical(BODY, level="normalized") == reference.canonical(
        BODY, level="normalized"
    )


@cpu
def test_fingerprint_normalized_reference(benchmark: BenchmarkFixture) -> None:
    key = benchmark(reference.fingerprint, BODY, level="normalized")
    assert len(key) == 16


@cpu
def test_fingerprint_exact_rust(benchmark: BenchmarkFixture) -> None:
    assert len(benchmark(router.fingerprint, BODY)) == 16
    assert router.canonical(BODY) == reference.canonical(BODY)


@cpu
def test_normalize_rust(benchmark: BenchmarkFixture) -> None:
    assert benchmark(router.normalize, PROMPT) == reference.normalize(PROMPT)


@cpu
def test_normalize_reference(benchmark: BenchmarkFixture) -> None:
    assert benchmark(reference.normalize, PROMPT) == router.normalize(PROMPT)


@cpu
@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_count_tokens_rust(benchmark: BenchmarkFixture, encoding: str) -> None:
    count = benchmark(router.count_tokens, PROMPT, encoding)
    enc = reference.tiktoken_encoding(encoding)
    if enc is not None:
        assert count == len(enc.encode_ordinary(PROMPT))


@cpu
@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_count_tokens_tiktoken(benchmark: BenchmarkFixture, encoding: str) -> None:
    enc = reference.tiktoken_encoding(encoding)
    if enc is None:
        pytest.skip("no tiktoken vocabulary file found in the tiktoken-rs crate sources")
    count = benchmark(lambda: len(enc.encode_ordinary(PROMPT)))
    assert count == router.count_tokens(PROMPT, encoding)


@cpu
def test_try_acquire_100k_keys(benchmark: BenchmarkFixture) -> None:
    table = router.BucketTable()
    keys = [f"tenant-{i:06d}" for i in range(100_000)]
    for key in keys:
        table.set_limits(key, requests_per_minute=1e9, tokens_per_minute=1e12)
    order = random.Random(3).choices(keys, k=1000)
    acquire = table.try_acquire

    def thousand() -> bool:
        ok = True
        for key in order:
            ok &= acquire(key, 10)[0]
        return ok

    # One round is 1000 calls: divide the figures by 1000 for ns per call.
    assert benchmark(thousand)
    assert len(table) == 100_000
