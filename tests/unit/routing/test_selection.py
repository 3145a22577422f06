"""Region selection: nearest healthy first, power-of-two-choices within the band, exclusions."""

from __future__ import annotations

import random
from collections import Counter

from router.routing.selection import AdminState, Candidate, scores, select


def cand(name: str, rtt_ms: float | None, ttft_ms: float | None = 0.0, **kw: object) -> Candidate:
    return Candidate(
        name=name,
        available=bool(kw.pop("available", True)),
        ewma_rtt_s=None if rtt_ms is None else rtt_ms / 1000,
        ewma_ttft_s=None if ttft_ms is None else ttft_ms / 1000,
        **kw,  # type: ignore[arg-type]
    )


def test_nearest_first_then_by_score_outside_the_band() -> None:
    cs = [cand("far", 80), cand("near", 5), cand("mid", 40)]
    sel = select(cs, tolerance_s=0.005, rng=random.Random(1))
    assert sel.names == ["near", "mid", "far"]
    assert not sel.panic
    assert [round(r.score_s, 3) for r in sel.order] == [0.005, 0.04, 0.08]


def test_score_adds_rtt_ttft_and_bias() -> None:
    cs = [cand("a", 10, 100), cand("b", 30, 20, bias_s=0.05)]
    assert [round(s, 3) for s in scores(cs)] == [0.11, 0.1]
    assert select(cs, tolerance_s=0.0, rng=random.Random(0)).names == ["b", "a"]


def test_bias_can_outweigh_latency() -> None:
    cs = [cand("near", 5, bias_s=0.2), cand("far", 50)]
    assert select(cs, tolerance_s=0.0, rng=random.Random(0)).names == ["far", "near"]


def test_unmeasured_latency_is_neither_bonus_nor_penalty() -> None:
    cs = [cand("new", None, None), cand("old", 20, 30), cand("slow", 90, 30)]
    assert [round(s, 3) for s in scores(cs)] == [0.05, 0.05, 0.12]
    assert scores([cand("x", None, None)]) == [0.0]


def test_unavailable_drained_and_disabled_are_excluded() -> None:
    cs = [
        cand("sick", 1, available=False),
        cand("drained", 2, admin=AdminState.DRAINED),
        cand("off", 3, admin=AdminState.DISABLED),
        cand("ok", 50),
    ]
    assert select(cs, tolerance_s=1.0, rng=random.Random(0)).names == ["ok"]


def test_panic_mode_ranks_every_active_region_when_none_is_available() -> None:
    cs = [
        cand("down", 1, available=False, healthy=False),
        cand("ejected", 30, available=False),
        cand("off", 1, available=False, admin=AdminState.DISABLED),
    ]
    sel = select(cs, tolerance_s=0.0, rng=random.Random(0))
    assert sel.panic
    assert sel.names == ["ejected", "down"]
    assert select(cs, tolerance_s=0.0, rng=random.Random(0), panic=False).names == []
    assert select([], tolerance_s=0.0, rng=random.Random(0)).names == []


def test_power_of_two_choices_prefers_fewer_in_flight_within_the_band() -> None:
    cs = [cand("a", 10, in_flight=9), cand("b", 12, in_flight=0), cand("far", 200, in_flight=0)]
    # With two in the band, both are always sampled: the idle one wins despite being farther.
    for seed in range(20):
        sel = select(cs, tolerance_s=0.005, rng=random.Random(seed))
        assert sel.names == ["b", "a", "far"]


def test_band_spreads_equal_load_instead_of_herding() -> None:
    cs = [cand(n, 10 + i, in_flight=0) for i, n in enumerate("abcd")]
    rng = random.Random(42)
    firsts = Counter(select(cs, tolerance_s=0.01, rng=rng).names[0] for _ in range(4000))
    # P2C with equal load and ties broken by score: a wins 1/2, b 1/3, c 1/6, d never.
    assert set(firsts) == {"a", "b", "c"}
    assert 1800 < firsts["a"] < 2200
    assert 1150 < firsts["b"] < 1520
    assert 500 < firsts["c"] < 830


def test_each_region_appears_once_and_fallbacks_follow_score() -> None:
    cs = [cand(n, ms) for n, ms in [("a", 10), ("b", 11), ("c", 50), ("d", 12)]]
    rng = random.Random(7)
    for _ in range(200):
        names = select(cs, tolerance_s=0.005, rng=rng).names
        assert sorted(names) == ["a", "b", "c", "d"]
        assert names[-1] == "c"
        assert names[0] in {"a", "b", "d"}
