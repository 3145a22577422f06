"""The load generator against real sim region subprocesses: counts, TTFT, bounds, error kinds."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from bench.procs import NGINX, procs

from router import cli
from router.loadgen import LoadSpec, Planned, RequestFactory, run_load, summarize
from router.loadgen.requests import endpoint_url, round_robin
from router.loadgen.schedule import poisson_schedule
from tests.support import REPO, Proc, free_port, router_cmd, spawn

TTFT_MS = 30.0
MAX_TOKENS = 5


def _sim(tmp: Path, name: str, *flags: str) -> Proc:
    port = free_port()
    args = router_cmd("sim-region", "--port", str(port), "--name", name, *flags)
    return spawn(args, port, tmp / f"{name}.log")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """A healthy region: 30 ms to the first token, 500 tokens/s."""
    proc = _sim(
        tmp_path_factory.mktemp("sim"), "ok", "--ttft-ms", str(TTFT_MS), "--tokens-per-s", "500"
    )
    yield proc
    proc.kill()


def _stats(proc: Proc) -> dict[str, object]:
    with urllib.request.urlopen(proc.url + "/sim/stats", timeout=5) as resp:
        stats: dict[str, object] = json.loads(resp.read())
        return stats


def _reset(proc: Proc) -> None:
    req = urllib.request.Request(proc.url + "/sim/reset", method="POST", data=b"")
    urllib.request.urlopen(req, timeout=5).close()


def _factory(proc: Proc, *, stream: bool = True) -> RequestFactory:
    url = endpoint_url(proc.url, "chat")
    return round_robin(
        url,
        ["one", "two", "three"],
        model="sim-1",
        endpoint="chat",
        max_tokens=MAX_TOKENS,
        stream=stream,
    )


async def test_closed_loop_sends_exactly_count_and_measures_ttft(sim: Proc) -> None:
    _reset(sim)
    spec = LoadSpec(concurrency=3, duration_s=30.0, max_requests=12)
    result = await run_load("closed", spec, _factory(sim))
    summary = summarize("closed", result.samples, result.wall_s)
    assert (summary.sent, summary.ok, summary.errors) == (12, 12, {})
    assert _stats(sim)["requests"] == 12
    assert summary.ttft_ms is not None
    assert summary.ttft_ms.n == 12
    # The sim waits TTFT_MS before the first token, so no measured TTFT can be shorter.
    assert summary.ttft_ms.min >= TTFT_MS
    assert all(s.chunks == MAX_TOKENS and len(s.itl_s) == MAX_TOKENS - 1 for s in result.samples)
    assert all(s.ttft_s is not None and s.total_s >= s.ttft_s for s in result.samples)
    assert summary.itl_ms is not None
    assert summary.itl_ms.n == 12 * (MAX_TOKENS - 1)


async def test_non_streaming_requests_have_no_ttft(sim: Proc) -> None:
    _reset(sim)
    spec = LoadSpec(concurrency=2, duration_s=30.0, max_requests=4, stream=False)
    result = await run_load("whole", spec, _factory(sim, stream=False))
    summary = summarize("whole", result.samples, result.wall_s)
    assert (summary.sent, summary.ok) == (4, 4)
    assert summary.ttft_ms is None
    assert summary.total_ms is not None
    assert summary.total_ms.min >= TTFT_MS
    assert _stats(sim)["streams"] == 0


async def test_open_loop_follows_the_poisson_schedule(sim: Proc) -> None:
    _reset(sim)
    spec = LoadSpec(concurrency=50, rate=40.0, duration_s=1.0, max_requests=10_000, seed=5)
    expected = len(poisson_schedule(40.0, 1.0, 10_000, random.Random(5)))
    result = await run_load("open", spec, _factory(sim))
    assert len(result.samples) == expected
    assert all(s.ok for s in result.samples), {s.error for s in result.samples}
    assert _stats(sim)["requests"] == expected
    starts = [s.start_s for s in result.samples]
    assert starts == sorted(starts)
    assert all(0 < t < 1.0 for t in starts)


async def test_a_whole_body_where_a_stream_was_expected_is_not_sse(sim: Proc) -> None:
    spec = LoadSpec(concurrency=1, duration_s=20.0, max_requests=2, stream=True)
    result = await run_load("json", spec, _factory(sim, stream=False))
    assert summarize("json", result.samples, result.wall_s).errors == {"not_sse": 2}


async def test_duration_bounds_a_run_with_a_huge_count(sim: Proc) -> None:
    spec = LoadSpec(concurrency=2, duration_s=0.5, max_requests=1_000_000, grace_s=5.0)
    result = await run_load("short", spec, _factory(sim))
    assert 0 < len(result.samples) < 1000
    assert all(s.ok for s in result.samples)
    assert all(s.start_s < 0.5 for s in result.samples)


async def test_error_kinds(tmp_path: Path) -> None:
    modes = [["503"], ["die-mid-stream", "--after-tokens", "2"], ["hang"], ["refuse"]]
    with ThreadPoolExecutor(len(modes)) as pool:
        busy, cut, hang, refuse = pool.map(lambda m: _sim(tmp_path, m[0], "--fail-mode", *m), modes)
    closed = free_port()
    try:
        spec = LoadSpec(concurrency=2, duration_s=10.0, max_requests=4, grace_s=1.0)
        r = await run_load("busy", spec, _factory(busy))
        assert summarize("b", r.samples, r.wall_s).errors == {"http_503": 4}
        r = await run_load("cut", spec, _factory(cut))
        assert summarize("c", r.samples, r.wall_s).errors == {"stream_cut": 4}
        r = await run_load("refuse", spec, _factory(refuse))
        assert summarize("r", r.samples, r.wall_s).errors == {"disconnected": 4}
        dead = round_robin(
            f"http://127.0.0.1:{closed}/v1/chat/completions",
            ["x"],
            model="sim-1",
            endpoint="chat",
            max_tokens=1,
            stream=True,
        )
        r = await run_load("dead", spec, dead)
        assert summarize("d", r.samples, r.wall_s).errors == {"connect": 4}
        # A region that never answers: the run still ends at duration + grace, with a record
        # of every request it cut off.
        short = LoadSpec(concurrency=3, duration_s=0.3, max_requests=100, grace_s=0.2)
        r = await run_load("hang", short, _factory(hang))
        assert summarize("h", r.samples, r.wall_s).errors == {"unfinished": 3}
        tight = LoadSpec(concurrency=1, duration_s=5.0, max_requests=1, timeout_s=0.3)
        r = await run_load("hang", tight, _factory(hang))
        assert summarize("t", r.samples, r.wall_s).errors == {"timeout": 1}
    finally:
        for proc in (busy, cut, hang, refuse):
            proc.kill()


def test_cli_writes_results_and_plots(sim: Proc, tmp_path: Path) -> None:
    out = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "bench.load",
        "--url",
        sim.url,
        "--concurrency",
        "2",
        "--count",
        "6",
        "--duration",
        "20",
        "--max-tokens",
        "3",
        "--name",
        "cli",
        "--results",
        str(out),
        "--plot",
        "--progress-interval",
        "0",
        "--origin-stats",
        f"ok={sim.url}",
        "--header",
        "X-Bench-Run: cli-1",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=50, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    assert "| cli | 6 | 6 |" in done.stdout
    assert "[cli]" in done.stderr  # the progress line
    runs = json.loads((out / "results.json").read_bytes())["runs"]
    assert runs[0]["sent"] == 6
    assert runs[0]["ttft_ms"]["n"] == 6
    assert runs[0]["origin"] == {"ok": 6}  # the region's own counter, before -> after
    last_headers = _stats(sim)["last_headers"]
    assert isinstance(last_headers, dict)
    assert {k.lower(): v for k, v in last_headers.items()}["x-bench-run"] == "cli-1"
    assert (out / "results.md").read_text().count("| cli |") == 1
    for png in ("ttft-cdf.png", "total-cdf.png", "traffic-cli.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_router_bench_reports_failures_in_its_exit_code() -> None:
    cmd = router_cmd(
        "bench",
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--count",
        "2",
        "--duration",
        "5",
        "--quiet",
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=50, cwd=REPO, check=False)
    assert done.returncode == 1
    assert "connect=2" in done.stdout


@pytest.mark.parametrize(
    "flags",
    [
        ["--url", "nope"],
        ["--concurrency", "0"],
        ["--duration", "inf"],
        ["--timeline-bin", "0"],
        ["--prompts-file", "/nonexistent/prompts.txt"],
        ["--origin-stats", "no-equals-sign"],
        ["--header", "no-colon"],
        ["--header", "X(: v"],
        ["--header", "X-A: a\r\nX-B: b"],
        ["--timeout", "nan"],
        ["--grace", "nan"],
        ["--timeout", "inf", "--grace", "inf"],
        ["--max-tokens", "0"],
        ["--progress-interval", "nan"],
        ["--url", "http://127.0.0.1:99999"],
        ["--url", "http://127.0.0.1:1/v1/chat/completions", "--endpoint", "completions"],
        ["--results", "/proc/self/results"],
    ],
)
def test_router_bench_rejects_bad_options_in_one_line(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", "--url", "http://127.0.0.1:1", "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router bench: ")
    assert err.count("\n") == 1


def test_router_bench_refuses_unusable_files_before_any_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    file = tmp_path / "file"
    file.write_text("x")
    # Port 1 refuses: any load would be seen as connect errors and exit 1, not 2.
    base = ["bench", "--url", "http://127.0.0.1:1", "--quiet", "--count", "1"]
    for flags in (
        ["--prompts-file", str(empty)],
        ["--results", str(file)],
        ["--results", str(file / "sub")],
    ):
        assert cli.main([*base, *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("router bench: ")
        assert err.count("\n") == 1


def test_router_bench_that_sent_nothing_fails(capsys: pytest.CaptureFixture[str]) -> None:
    # Poisson arrivals at 0.001/s: none falls inside 0.1 s.
    argv = ["bench", "--url", "http://127.0.0.1:1", "--quiet", "--rate", "0.001"]
    assert cli.main([*argv, "--duration", "0.1"]) == 1
    assert "no request was sent" in capsys.readouterr().err


async def _answering(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_a_200_error_body_is_a_bad_response_at_both_endpoints(endpoint: str) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "overloaded", "code": "busy"}})

    runner, base = await _answering(handler)
    try:
        factory = round_robin(
            endpoint_url(base, endpoint),  # type: ignore[arg-type]
            ["x"],
            model="sim-1",
            endpoint=endpoint,  # type: ignore[arg-type]
            max_tokens=1,
            stream=False,
        )
        spec = LoadSpec(
            concurrency=1,
            max_requests=2,
            duration_s=5.0,
            stream=False,
            endpoint=endpoint,  # type: ignore[arg-type]
        )
        r = await run_load("err", spec, factory)
    finally:
        await runner.cleanup()
    assert summarize("e", r.samples, r.wall_s).errors == {"bad_response": 2}


async def test_a_stream_without_content_is_empty_not_ok() -> None:
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(role + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    runner, base = await _answering(handler)
    try:
        factory = round_robin(
            endpoint_url(base, "chat"),
            ["x"],
            model="sim-1",
            endpoint="chat",
            max_tokens=1,
            stream=True,
        )
        r = await run_load(
            "empty", LoadSpec(concurrency=1, max_requests=2, duration_s=5.0), factory
        )
    finally:
        await runner.cleanup()
    s = summarize("e", r.samples, r.wall_s)
    assert (s.ok, s.errors, s.ttft_ms) == (0, {"empty": 2}, None)


def test_api_key_is_sent_as_bearer_to_a_real_router(sim: Proc, tmp_path: Path) -> None:
    key = "sk-bench-test"
    port = free_port()
    config = tmp_path / "router.toml"
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\n'
        f'[[auth.keys]]\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n'
        'tenant = "bench"\n'
        f'[[regions]]\nname = "ok"\nbase_url = "{sim.url}/v1"\nmodels = ["sim-1"]\n'
    )
    router = spawn(router_cmd("serve", "--config", str(config)), port, tmp_path / "router.log")
    try:
        base = [
            "bench",
            "--url",
            router.url,
            "--model",
            "sim-1",
            "--count",
            "3",
            "--concurrency",
            "1",
            "--duration",
            "20",
            "--max-tokens",
            "2",
            "--quiet",
        ]
        ok = subprocess.run(
            router_cmd(*base, "--api-key", key),
            capture_output=True,
            text=True,
            timeout=50,
            cwd=REPO,
            check=False,
        )
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "| load | 3 | 3 |" in ok.stdout
        env = {k: v for k, v in os.environ.items() if "API_KEY" not in k}
        anon = subprocess.run(
            router_cmd(*base),
            capture_output=True,
            text=True,
            timeout=50,
            cwd=REPO,
            check=False,
            env=env,
        )
        assert anon.returncode == 1
        # The OpenAI error code rides along with the status (the router's own wording).
        assert re.search(r"\| http_401:[a-z_]+=3 \|", anon.stdout), anon.stdout
    finally:
        router.kill()


@pytest.mark.parametrize("rate", [None, 50.0])
async def test_a_broken_request_factory_fails_the_run(sim: Proc, rate: float | None) -> None:
    good = _factory(sim)

    def factory(index: int) -> Planned:
        if index == 2:
            raise LookupError("no request 2")
        return good(index)

    spec = LoadSpec(concurrency=10, rate=rate, duration_s=2.0, max_requests=5, grace_s=1.0)
    with pytest.raises(LookupError, match="no request 2"):
        await run_load("broken", spec, factory)


@pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed")
async def test_nginx_from_bench_procs_relays_the_stream(sim: Proc, tmp_path: Path) -> None:
    with procs(tmp_path / "procs") as pr:
        nginx = pr.nginx(sim.port)
        spec = LoadSpec(concurrency=2, duration_s=20.0, max_requests=6)
        result = await run_load("nginx", spec, _factory(nginx))
    summary = summarize("nginx", result.samples, result.wall_s)
    assert (summary.sent, summary.ok) == (6, 6)
    # Unbuffered: tokens arrive one by one, after the region's own TTFT.
    assert all(s.chunks == MAX_TOKENS and len(s.itl_s) == MAX_TOKENS - 1 for s in result.samples)
    assert summary.ttft_ms is not None
    assert summary.ttft_ms.min >= TTFT_MS
    assert nginx.popen.poll() is not None  # killed with the procs block


_HOLDS_A_REGION = """
import sys, time
from pathlib import Path
from bench.procs import interruptible, procs

def body() -> int:
    with procs(Path(sys.argv[1])) as pr:
        sim = pr.sim_region("x", rtt_ms=0, ttft_ms=0, tokens_per_s=100)
        print(sim.popen.pid, flush=True)
        time.sleep(60)
    return 0

raise SystemExit(interruptible("holder", body))
"""


@pytest.mark.parametrize(
    ("sig", "code", "word"), [(15, 143, "terminated"), (2, 130, "interrupted")]
)
def test_a_signalled_scenario_stops_its_processes_in_one_line(
    tmp_path: Path, sig: int, code: int, word: str
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDS_A_REGION, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        child = int(holder.stdout.readline())
        holder.send_signal(sig)
        _, err = holder.communicate(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == code
    assert err == f"holder: {word}\n"
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # killed and reaped, not orphaned
