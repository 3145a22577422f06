"""Property: a bucket never admits more than burst + rate * elapsed, and never refuses what
burst + rate * elapsed allows (it admits the configured rate)."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

import router

# Float slack for the bucket arithmetic; not a timing tolerance.
EPS = 1e-6


@settings(max_examples=60, deadline=None)
@given(
    rpm=st.floats(min_value=0, max_value=1e6),
    tpm=st.floats(min_value=0, max_value=1e7),
    request_burst=st.one_of(st.none(), st.floats(min_value=0, max_value=100)),
    token_burst=st.one_of(st.none(), st.floats(min_value=0, max_value=1e4)),
    asks=st.lists(st.integers(min_value=0, max_value=2000), min_size=1, max_size=60),
)
def test_admitted_between_bounds(
    rpm: float,
    tpm: float,
    request_burst: float | None,
    token_burst: float | None,
    asks: list[int],
) -> None:
    table = router.BucketTable(shards=2)
    start = time.monotonic()
    table.set_limits(
        "k",
        requests_per_minute=rpm,
        tokens_per_minute=tpm,
        request_burst=request_burst,
        token_burst=token_burst,
    )
    # The table's clock reads inside set_limits, so elapsed measured from `start` bounds it.
    req_cap = rpm if request_burst is None else request_burst
    tok_cap = tpm if token_burst is None else token_burst
    requests = tokens = 0
    for ask in asks:
        allowed, retry, rem_req, rem_tok, _, _ = table.try_acquire("k", ask)
        after = time.monotonic() - start
        req_limit = req_cap + rpm / 60 * after
        tok_limit = tok_cap + tpm / 60 * after
        if allowed:
            requests += 1
            tokens += ask
            assert retry == 0.0
        else:
            # A refusal is explained by the levels it reports (taken before any deduction).
            assert rem_req < 1 or rem_tok < ask
            assert retry > 0
        assert requests <= req_limit + EPS
        assert tokens <= tok_limit + EPS * max(1.0, tok_limit)
        assert rem_req <= req_cap + EPS
        assert rem_tok <= tok_cap + EPS


@settings(max_examples=40, deadline=None)
@given(
    burst=st.integers(min_value=1, max_value=200),
    asks=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=300),
)
def test_burst_fully_admitted_with_no_refill(burst: int, asks: list[int]) -> None:
    # A near-zero rate isolates the burst: exactly what fits in it must be admitted, in order.
    table = router.BucketTable(shards=1)
    table.set_limits(
        "k",
        requests_per_minute=1e-9,
        tokens_per_minute=1e-9,
        request_burst=burst,
        token_burst=burst * 10,
    )
    requests, tokens = 0, 0
    for ask in asks:
        allowed = table.try_acquire("k", ask)[0]
        expected = requests + 1 <= burst and tokens + ask <= burst * 10
        assert allowed == expected
        if allowed:
            requests += 1
            tokens += ask
