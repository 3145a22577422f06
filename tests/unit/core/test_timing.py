"""Server-Timing rendering over the stages the request context records."""

from __future__ import annotations

from router.core.timing import StageTimer, parse_server_timing, server_timing, totals


def test_totals_add_up_repeated_stages() -> None:
    assert totals([("connect", 5), ("auth", 1), ("connect", 7)]) == {"connect": 12, "auth": 1}


def test_header_round_trips_in_milliseconds() -> None:
    header = server_timing({"auth": 41_000, "total": 12_500_000})
    assert header == "auth;dur=0.041, total;dur=12.500"
    assert parse_server_timing(header) == {"auth": 0.041, "total": 12.5}


def test_only_picks_stages_in_the_given_order() -> None:
    durations = {"total": 3_000_000, "auth": 1_000_000, "secret": 1}
    assert server_timing(durations, only=("auth", "cache", "total")) == (
        "auth;dur=1.000, total;dur=3.000"
    )
    assert server_timing({}) == ""


def test_parse_ignores_other_params_and_junk() -> None:
    assert parse_server_timing('cache;desc="x";dur=2, miss, ;dur=1') == {"cache": 2.0}


def test_end_open_ends_only_the_stages_still_timing() -> None:
    timer = StageTimer()
    timer.begin("parse")
    timer.end("parse")
    parsed = timer.durations["parse"]
    timer.begin("upstream")
    timer.begin("stream")
    timer.end_open()
    assert list(timer.durations) == ["parse", "upstream", "stream"]
    assert timer.durations["parse"] == parsed
    timer.end_open()  # nothing open: nothing changes
    assert list(timer.durations) == ["parse", "upstream", "stream"]
