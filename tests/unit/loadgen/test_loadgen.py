"""The load generator's pure parts: percentiles, schedules, SSE parsing, summaries, writers."""

from __future__ import annotations

import io
import itertools
import json
import random
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from router.loadgen.client import http_error_kind
from router.loadgen.progress import Progress
from router.loadgen.report import markdown_table, to_json, write_results
from router.loadgen.requests import body, endpoint_url, round_robin
from router.loadgen.runner import LoadSpec
from router.loadgen.sample import Sample
from router.loadgen.schedule import poisson_schedule
from router.loadgen.sse import StreamError, chunk_content
from router.loadgen.stats import distribution, percentile
from router.loadgen.summary import Summary, region_timeline, summarize
from router.net.sse import Decoder as SseParser


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.25) == 2.0
    assert percentile(values, 1.0) == 5.0
    assert percentile(values, 0.9) == pytest.approx(4.6)
    assert percentile([7.0], 0.999) == 7.0


def test_percentile_matches_statistics_inclusive_method() -> None:
    rng = random.Random(3)
    values = sorted(rng.expovariate(1.0) for _ in range(1001))
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    assert percentile(values, 0.5) == pytest.approx(cuts[499])
    assert percentile(values, 0.95) == pytest.approx(cuts[949])
    assert percentile(values, 0.99) == pytest.approx(cuts[989])
    assert percentile(values, 0.999) == pytest.approx(cuts[998])


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 1.5)


def test_distribution_is_in_milliseconds_and_names_p999() -> None:
    dist = distribution([0.001 * i for i in range(1, 101)])
    assert dist is not None
    assert dist.n == 100
    assert dist.min == pytest.approx(1.0)
    assert dist.max == pytest.approx(100.0)
    assert dist.p50 == pytest.approx(50.5)
    assert dist.mean == pytest.approx(50.5)
    assert distribution([]) is None
    encoded = json.loads(to_json([summarize("r", [_ok(0.0, ttft=0.01)], 1.0)]))
    assert set(encoded["runs"][0]["ttft_ms"]) == {
        "n",
        "mean",
        "min",
        "max",
        "p50",
        "p95",
        "p99",
        "p99.9",
    }


def test_poisson_schedule_is_bounded_by_count_and_duration() -> None:
    by_count = poisson_schedule(1000.0, 60.0, 25, random.Random(1))
    assert len(by_count) == 25
    by_time = poisson_schedule(50.0, 2.0, 10_000, random.Random(1))
    assert all(0 < t < 2.0 for t in by_time)
    assert by_time == sorted(by_time)
    assert len(set(by_time)) == len(by_time)
    assert poisson_schedule(5.0, 1.0, 0, random.Random(1)) == []


def test_poisson_schedule_has_the_asked_rate_and_is_reproducible() -> None:
    offsets = poisson_schedule(100.0, 100.0, 1_000_000, random.Random(7))
    # 10,000 expected arrivals; the standard deviation is 100, so 5% is 5 sigma.
    assert 9_500 < len(offsets) < 10_500
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.fmean(gaps) == pytest.approx(0.01, rel=0.05)
    # Same seed, shorter run: the same arrivals, cut at the shorter duration.
    assert poisson_schedule(100.0, 1.0, 1_000_000, random.Random(7)) == [
        t for t in offsets if t < 1.0
    ]


@pytest.mark.parametrize(
    ("rate", "duration", "count"),
    [(0.0, 1.0, 1), (-1.0, 1.0, 1), (float("inf"), 1.0, 1), (1.0, 0.0, 1), (1.0, 1.0, -1)],
)
def test_poisson_schedule_rejects_unbounded_or_invalid(
    rate: float, duration: float, count: int
) -> None:
    with pytest.raises(ValueError, match="must be"):
        poisson_schedule(rate, duration, count, random.Random(0))


def test_sse_parser_handles_split_events_crlf_multiline_and_comments() -> None:
    parser = SseParser()
    assert parser.feed(b'data: {"a"') == []
    assert parser.feed(b": 1}\n\n: keep-alive\n\ndata: x\r\ndata: y\r\n\r\n") == [
        b'{"a": 1}',
        b"x\ny",
    ]
    assert parser.feed(b"event: foo\nid: 3\ndata:[DONE]\n") == []
    assert parser.feed(b"\n") == [b"[DONE]"]


def test_chunk_content_reads_chat_and_completions_chunks() -> None:
    chat = b'{"choices":[{"index":0,"delta":{"content":"Hel"}}]}'
    assert chunk_content(chat, "chat") == "Hel"
    assert chunk_content(b'{"choices":[{"delta":{"role":"assistant"}}]}', "chat") == ""
    assert chunk_content(b'{"choices":[],"usage":{"total_tokens":3}}', "chat") == ""
    assert chunk_content(b'{"choices":[{"text":"lo"}]}', "completions") == "lo"
    with pytest.raises(StreamError, match="overloaded"):
        chunk_content(b'{"error":{"message":"overloaded"}}', "chat")
    with pytest.raises(StreamError, match="undecodable"):
        chunk_content(b"not json", "chat")


def test_http_error_kind_includes_the_openai_code() -> None:
    body_429 = (
        b'{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}'
    )
    assert http_error_kind(429, body_429) == "http_429:rate_limit_exceeded"
    assert http_error_kind(502, b"<html>bad gateway</html>") == "http_502"
    assert http_error_kind(500, b'{"error":{"message":"x","code":null}}') == "http_500"


def _ok(
    start: float, *, ttft: float | None = None, region: str | None = "eu", total: float = 0.1
) -> Sample:
    return Sample(
        start_s=start,
        total_s=total,
        ttft_s=ttft,
        itl_s=[0.01, 0.02],
        chunks=3,
        status=200,
        region=region,
    )


def test_summarize_counts_errors_by_kind_and_regions_of_successes_only() -> None:
    samples = [
        _ok(0.0, ttft=0.05, region="eu"),
        _ok(0.5, ttft=0.07, region="us"),
        _ok(1.0, ttft=0.09, region="eu"),
        Sample(
            start_s=1.2, total_s=0.2, status=503, error="http_503:no_healthy_region", region="eu"
        ),
        Sample(start_s=1.3, total_s=0.0, error="connect"),
        Sample(start_s=1.4, total_s=0.0, error="connect"),
    ]
    s = summarize("run", samples, 2.0, config={"concurrency": 2})
    assert (s.sent, s.ok) == (6, 3)
    assert s.errors == {"connect": 2, "http_503:no_healthy_region": 1}
    assert s.regions == {"eu": 2, "us": 1}
    assert s.rps == 3.0
    assert s.ok_rps == 1.5
    assert s.ttft_ms is not None
    assert s.ttft_ms.n == 3
    assert s.ttft_ms.p50 == pytest.approx(70.0)
    assert s.itl_ms is not None
    assert s.itl_ms.n == 6
    assert s.total_ms is not None
    assert s.total_ms.n == 3
    assert s.config == {"concurrency": 2}


def test_rps_counts_only_requests_that_were_sent() -> None:
    saturated = Sample(start_s=0.1, total_s=0.0, error="client_saturated")
    s = summarize("run", [_ok(0.0), _ok(0.2), saturated, saturated], 2.0)
    assert (s.sent, s.ok) == (4, 2)  # every recorded arrival, so counts add up
    assert s.rps == 1.0  # but a client_saturated arrival never reached the server


def test_region_timeline_bins_successes_by_start_time() -> None:
    samples = [
        _ok(0.1, region="a"),
        _ok(0.9, region="a"),
        _ok(1.5, region="b"),
        _ok(2.2, region="a"),
        Sample(start_s=2.5, total_s=0.0, error="timeout"),
    ]
    starts, series = region_timeline(samples, 1.0)
    assert starts == [0.0, 1.0, 2.0]
    assert series == {"a": [2, 0, 1], "b": [0, 1, 0]}
    assert region_timeline([], 1.0) == ([], {})
    with pytest.raises(ValueError, match="positive"):
        region_timeline(samples, 0.0)


def test_markdown_table_has_one_row_per_run_and_the_notes() -> None:
    a = summarize("centralized", [_ok(0.0, ttft=0.34)], 1.0)
    b = summarize(
        "routed", [_ok(0.0, ttft=0.085), Sample(start_s=0.1, total_s=0.0, error="timeout")], 1.0
    )
    b.notes.append("cache not available")
    table = markdown_table([a, b])
    lines = table.splitlines()
    assert lines[0].startswith("| run | sent | ok |")
    assert lines[1].count("---") == lines[0].count("|") - 1
    assert lines[2].startswith("| centralized | 1 | 1 |")
    assert "| 340.0 |" in lines[2]
    assert lines[3].startswith("| routed | 2 | 1 |")
    assert "timeout=1" in lines[3]
    assert "- routed: cache not available" in table


def test_write_results_writes_json_markdown_and_only_asked_plots(tmp_path: Path) -> None:
    samples = {"a": [_ok(0.1 * i, ttft=0.01 * i + 0.01) for i in range(20)]}
    summary = summarize("a", samples["a"], 2.0)
    plain = write_results(tmp_path / "plain", [summary], title="t")
    assert [p.name for p in plain] == ["results.json", "results.md"]
    assert json.loads((tmp_path / "plain" / "results.json").read_bytes())["runs"][0]["sent"] == 20
    assert (tmp_path / "plain" / "results.md").read_text().startswith("# t\n\n| run |")
    plotted = write_results(tmp_path / "p", [summary], samples=samples, plots=True, timeline="a")
    names = sorted(p.name for p in plotted)
    assert names == sorted(
        [
            "results.json",
            "results.md",
            "samples.json",
            "ttft-cdf.png",
            "total-cdf.png",
            "traffic-a.png",
        ]
    )
    for p in plotted:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "p" / "samples.json").read_bytes())
    assert len(saved["a"]) == 20


@pytest.mark.parametrize(
    ("base", "endpoint", "url"),
    [
        ("http://127.0.0.1:8080", "chat", "http://127.0.0.1:8080/v1/chat/completions"),
        ("http://127.0.0.1:8080/", "chat", "http://127.0.0.1:8080/v1/chat/completions"),
        ("https://api.example.com/v1", "completions", "https://api.example.com/v1/completions"),
        ("http://h:1/v1/chat/completions", "chat", "http://h:1/v1/chat/completions"),
        ("http://h:1/openai", "chat", "http://h:1/openai/v1/chat/completions"),
        ("http://h:1/v1/completions/", "completions", "http://h:1/v1/completions"),
        (
            "http://h:1/v1?api-version=2024",
            "chat",
            "http://h:1/v1/chat/completions?api-version=2024",
        ),
        ("http://h:1/x/v1/completions?k=v", "completions", "http://h:1/x/v1/completions?k=v"),
    ],
)
def test_endpoint_url(base: str, endpoint: str, url: str) -> None:
    assert endpoint_url(base, endpoint) == url  # type: ignore[arg-type]


def test_endpoint_url_rejects_non_http() -> None:
    with pytest.raises(ValueError, match="not an http"):
        endpoint_url("ftp://x/", "chat")
    with pytest.raises(ValueError, match="not an http"):
        endpoint_url("127.0.0.1:8080", "chat")


@pytest.mark.parametrize(
    ("base", "endpoint", "match"),
    [
        # "/completions" ends "/chat/completions" too: the chat URL must not pass for it.
        ("http://h:1/v1/chat/completions", "completions", "is the chat endpoint"),
        ("http://h:1/v1/completions", "chat", "is the completions endpoint"),
        ("http://127.0.0.1:99999", "chat", "not in 1-65535"),
        ("http://127.0.0.1:0/v1", "chat", "not in 1-65535"),
    ],
)
def test_endpoint_url_rejects_conflicts_and_bad_ports(base: str, endpoint: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        endpoint_url(base, endpoint)  # type: ignore[arg-type]


def test_bodies_and_round_robin() -> None:
    chat = json.loads(body("hi", model="m", endpoint="chat", max_tokens=4, stream=True))
    assert chat == {
        "model": "m",
        "max_tokens": 4,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    text = json.loads(body("hi", model="m", endpoint="completions", max_tokens=4, stream=False))
    assert text["prompt"] == "hi"
    assert text["stream"] is False
    factory = round_robin(
        "http://h/v1/chat/completions",
        ["a", "b"],
        model="m",
        endpoint="chat",
        max_tokens=1,
        stream=True,
    )
    contents = [json.loads(factory(i).body)["messages"][0]["content"] for i in range(5)]
    assert contents == ["a", "b", "a", "b", "a"]
    with pytest.raises(ValueError, match="prompt"):
        round_robin("http://h", [], model="m", endpoint="chat", max_tokens=1, stream=True)


@pytest.mark.parametrize(
    "spec",
    [
        LoadSpec(concurrency=0),
        LoadSpec(rate=0.0),
        LoadSpec(duration_s=float("inf")),
        LoadSpec(duration_s=0.0),
        LoadSpec(max_requests=0),
        LoadSpec(timeout_s=0.0),
        LoadSpec(timeout_s=float("nan")),
        LoadSpec(timeout_s=float("inf")),
        LoadSpec(grace_s=float("nan")),
        LoadSpec(grace_s=float("inf")),
        LoadSpec(grace_s=-1.0),
        LoadSpec(duration_s=float("nan")),
        LoadSpec(rate=float("nan")),
    ],
)
def test_load_spec_rejects_unbounded_or_invalid(spec: LoadSpec) -> None:
    with pytest.raises(ValueError, match="must be"):
        spec.validate()


def test_progress_is_throttled_and_forced_at_the_end() -> None:
    out = io.StringIO()
    progress = Progress("x", interval_s=3600.0, out=out)
    progress.update(1.0, sent=3, done=2, errors=1, in_flight=1)
    progress.update(1.5, sent=4, done=3, errors=1, in_flight=1)
    progress.update(2.0, sent=4, done=4, errors=1, in_flight=0, force=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[x]")
    assert "done 2 errors 1 in-flight 1" in lines[0]
    assert "done 4" in lines[1]
    assert "2.0 req/s" in lines[1]


def test_router_cli_does_not_import_matplotlib() -> None:
    code = (
        "import sys, router.cli as c; p = c.build_parser(); "
        "a = p.parse_args(['bench', '--url', 'http://127.0.0.1:1']); "
        "print(a.handler.__module__, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.split() == ["router.loadgen.cli", "False"]


def test_plot_without_matplotlib_is_refused_before_any_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An installed wheel has no matplotlib unless `router[plot]` was asked for: one line and
    # exit 2 before the run, not a traceback after it. Port 1 refuses: a run would fail.
    import router.cli

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec answers None
    out = tmp_path / "results"
    args = router.cli.build_parser().parse_args(
        ["bench", "--url", "http://127.0.0.1:1", "--count", "1", "--plot", "--results", str(out)]
    )
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert err == "router bench: --plot needs matplotlib: pip install 'router[plot]'\n"
    assert not out.exists()


def test_origin_options_and_deltas() -> None:
    from router.loadgen.origin import origin_delta, parse_origins

    assert parse_origins(["eu=http://127.0.0.1:1/", "us=https://h:2"]) == {
        "eu": "http://127.0.0.1:1",
        "us": "https://h:2",
    }
    for bad in ("eu", "=http://x", "eu=ftp://x"):
        with pytest.raises(ValueError, match="NAME=http"):
            parse_origins([bad])
    assert origin_delta({"eu": 10, "us": 3}, {"eu": 4}) == {"eu": 6, "us": 3}


def test_header_options() -> None:
    from router.loadgen.cli import parse_headers

    assert parse_headers(["OpenAI-Organization: org-1", "x-a:b: c"]) == {
        "openai-organization": "org-1",
        "x-a": "b: c",
    }
    for bad in ("no-colon", ": v", "two words: v", "X(: v", "X\u00e9: v"):
        with pytest.raises(ValueError, match="Name: value"):
            parse_headers([bad])
    for bad in ("X-A: a\r\nX-B: b", "X-A: a\nb", "X-A: a\0"):
        with pytest.raises(ValueError, match="CR, LF or NUL"):
            parse_headers([bad])


@pytest.mark.parametrize(
    ("body", "endpoint", "text"),
    [
        (b'{"choices":[{"message":{"role":"assistant","content":"hi"}}]}', "chat", "hi"),
        (b'{"choices":[{"message":{"role":"assistant","content":null}}]}', "chat", ""),
        (b'{"choices":[{"text":"hi"}]}', "completions", "hi"),
    ],
)
def test_whole_text_reads_answers(body: bytes, endpoint: str, text: str) -> None:
    from router.loadgen.client import whole_text

    assert whole_text(body, endpoint) == text  # type: ignore[arg-type]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize(
    "body",
    [b'{"error":{"message":"overloaded","code":"busy"}}', b"{}", b'{"choices":[]}', b"not json"],
)
def test_whole_text_refuses_error_bodies_and_no_choices(body: bytes, endpoint: str) -> None:
    from router.loadgen.client import whole_text

    with pytest.raises(StreamError):
        whole_text(body, endpoint)  # type: ignore[arg-type]


def test_prepare_folder_creates_it_or_says_why_not(tmp_path: Path) -> None:
    from router.loadgen.report import prepare_folder

    prepare_folder(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe leaves nothing behind
    file = tmp_path / "file"
    file.write_text("x")
    for bad in (file, file / "sub"):
        with pytest.raises(NotADirectoryError):
            prepare_folder(bad)


# ---- the scenarios' pure parts (bench/scenarios, bench/procs) ----


def test_topology_rtts_are_symmetric_and_in_the_issue_ranges() -> None:
    from bench.scenarios.topology import POPS, nearest, rtt_ms

    for pop in POPS:
        assert nearest(pop) == pop
        assert 10 <= rtt_ms(pop, pop) <= 20
        for region in POPS:
            assert rtt_ms(pop, region) == rtt_ms(region, pop)
            if region != pop:
                assert 100 <= rtt_ms(pop, region) <= 180


def test_global_users_workload_is_reproducible_and_only_surface_varies() -> None:
    from bench.scenarios.global_users import repeat_ceiling, workload

    a = workload(300, 20, 1.0, random.Random(4))
    assert a == workload(300, 20, 1.0, random.Random(4))
    # What the normalized level folds: blank space only, never letter case.
    canon = {" ".join(p.split()) for p in a}
    assert len({c.lower() for c in canon}) <= 20
    assert len(set(a)) > len(canon)  # spacing variants an exact cache cannot match
    assert repeat_ceiling(a) == pytest.approx(1 - len(canon) / 300)
    assert repeat_ceiling(["x", "x ", " x"]) == pytest.approx(2 / 3)
    assert repeat_ceiling(["x", "X", "x  y", "x y"]) == pytest.approx(1 / 4)
    assert repeat_ceiling([]) == 0.0


# What each bench script starts its load with: replaced in the option tests below, so a check
# that lets a bad option through fails the test instead of running a benchmark.
_LOAD_STARTS = {
    "overhead": ["_start", "_start_workers"],
    "frontends": ["spawn"],
    "critical_path": ["measure"],
    "opcodes": ["measure"],
    "scenarios.global_users": ["procs"],
    "scenarios.agent_loop": ["procs"],
    "scenarios.overhead_nginx": ["procs"],
}


def _no_load(monkeypatch: pytest.MonkeyPatch, module: str) -> Callable[[list[str]], object]:
    import importlib

    mod = importlib.import_module(f"bench.{module}")

    def started(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError(f"bench.{module} started its load")

    for name in _LOAD_STARTS[module]:
        monkeypatch.setattr(mod, name, started)
    main: Callable[[list[str]], object] = mod.main
    return main


@pytest.mark.parametrize(
    ("module", "flags"),
    [
        ("global_users", ["--users-per-pop", "0"]),
        ("global_users", ["--distinct", "0"]),
        ("global_users", ["--requests-per-pop", "0"]),
        ("global_users", ["--duration", "nan"]),
        ("agent_loop", ["--calls", "0"]),
        ("agent_loop", ["--parallel", "0"]),
        ("agent_loop", ["--timeout", "inf"]),
        ("overhead_nginx", ["--concurrency", "0"]),
    ],
)
def test_scenarios_refuse_bad_options_before_starting_anything(
    module: str,
    flags: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    main = _no_load(monkeypatch, f"scenarios.{module}")
    with pytest.raises(SystemExit) as exit_:
        main(["--results", str(tmp_path / "r"), *flags])
    assert exit_.value.code == 2
    assert "error: " in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing started, not even the logs folder


@pytest.mark.parametrize(
    "flags",
    [
        ["--duration", "nan"],
        ["--concurrency", "0"],
        ["--concurrency", "32", "-1"],
        ["--rate", "-5"],
        ["--rate", "nan"],
        ["--warmup", "-1"],
        ["--warmup", "nan"],
    ],
)
def test_overhead_refuses_bad_options(
    flags: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    main = _no_load(monkeypatch, "overhead")
    with pytest.raises(SystemExit) as exit_:
        main(flags)
    assert exit_.value.code == 2
    assert "error: " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "flags"),
    [
        ("overhead", []),
        ("frontends", []),
        ("critical_path", []),
        ("opcodes", []),
        ("scenarios.global_users", ["--results"]),
        ("scenarios.agent_loop", ["--results"]),
    ],
)
def test_bench_scripts_refuse_unwritable_outputs_in_one_line(
    module: str,
    flags: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    main = _no_load(monkeypatch, module)
    file = tmp_path / "file"
    file.write_text("x")
    flag = flags or ["--json"]
    for bad in (file / "out", Path("/proc/self/no/out")):
        with pytest.raises(SystemExit) as exit_:
            main([*flag, str(bad)])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"error: {flag[0]} {bad}: " in err
    if flags:  # a results folder that is a file
        with pytest.raises(SystemExit):
            main([*flag, str(file)])
        assert "exists and is not a folder" in capsys.readouterr().err


def test_output_checks_leave_nothing_behind(tmp_path: Path) -> None:
    import argparse

    from bench.outputs import check_file, check_folder

    parser = argparse.ArgumentParser()
    check_file(parser, "--json", tmp_path / "new.json")
    assert not (tmp_path / "new.json").exists()
    (tmp_path / "old.json").write_text("kept")
    check_file(parser, "--json", tmp_path / "old.json")
    assert (tmp_path / "old.json").read_text() == "kept"
    check_folder(parser, "--results", tmp_path / "a" / "b")
    assert list((tmp_path / "a" / "b").iterdir()) == []
    with pytest.raises(SystemExit):
        check_file(parser, "--json", tmp_path)  # a folder


def test_native_figures_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.native_figures import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_expected_ttft_is_the_median_pop() -> None:
    from bench.scenarios.global_users import expected_ttft_ms

    assert expected_ttft_ms(lambda _: "us-east", 60.0) == 160.0  # eu-west: 100 ms + 60
    assert expected_ttft_ms(lambda pop: pop, 60.0) == 75.0  # 12/15/18 ms -> 15 + 60


def test_nginx_config_streams_through_a_keepalive_pool(tmp_path: Path) -> None:
    from bench.procs import nginx_config

    conf = nginx_config(tmp_path, 8081, 9091)
    assert "daemon off;" in conf
    assert "listen 127.0.0.1:8081;" in conf
    assert "server 127.0.0.1:9091;" in conf
    assert "proxy_buffering off;" in conf
    assert 'proxy_set_header Connection "";' in conf
    assert f"pid {tmp_path}/nginx.pid;" in conf


def test_overhead_notes_subtract_direct() -> None:
    from bench.scenarios.overhead_nginx import overhead_notes

    def run(name: str, ttft: float, total: float, n: int) -> Summary:
        return summarize(name, [_ok(0.0, ttft=ttft, total=total)] * n, 1.0)

    rows = [run("direct", 0.001, 0.002, 10), run("nginx", 0.0015, 0.003, 8)]
    (note,) = overhead_notes(rows)
    assert note.startswith("- nginx over direct: TTFT +0.50 ms p50")
    assert "total +1.00 ms p50" in note
    assert "throughput 80% of direct" in note
    assert overhead_notes(rows[1:]) == []


def test_agent_task_rows_count_only_complete_tasks() -> None:
    from bench.scenarios.agent_loop import Task, task_row, task_table

    full = Task(pop="a", index=0, total_s=1.5, calls=[_ok(0.0)] * 3)
    short = Task(pop="a", index=1, total_s=0.2, calls=[_ok(0.0)] * 2)
    failed = Task(
        pop="a",
        index=2,
        total_s=0.3,
        calls=[_ok(0.0), Sample(start_s=0.1, total_s=0.1, error="timeout")],
    )
    row = task_row("x", [full, short, failed], calls=3)
    assert (row.tasks, row.ok) == (3, 1)
    assert row.task_ms is not None
    assert row.task_ms.p50 == pytest.approx(1500.0)
    assert "| x | 3 | 1 | 3 | 1500 | 1500 | 1500 |" in task_table([row])
