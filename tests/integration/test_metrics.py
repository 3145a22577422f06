"""A real router in front of sim regions: a known request sequence, then /metrics, Server-Timing
and the access log must reflect it exactly."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.core.timing import parse_server_timing
from tests.integration.conftest import MODEL, region_toml, sim_config, start_router, start_sim
from tests.support import Proc, is_access_line, router_cmd

HEADER = """
[timeouts]
connect = 1.0
first_byte = 5.0

[auth]
enabled = false
"""
CACHE = "\n[cache]\nenabled = true\n"
SECRET = "sk-never-log-this-3f9a"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def timing(self) -> dict[str, float]:
        header = self.headers.get("server-timing")
        assert header, f"no Server-Timing on a {self.status} answer"
        return parse_server_timing(header)


def call(
    url: str, body: bytes | dict[str, Any] | None, headers: dict[str, str] | None = None
) -> Answer:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


def chat(router: Proc, content: str, **extra: Any) -> Answer:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
    return call(router.url + "/v1/chat/completions", body, {"Authorization": f"Bearer {SECRET}"})


def samples(router: Proc) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(router.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:  # fmt: skip
    return metrics.get((name, frozenset(labels.items())))


# Spans the proxy measures inside its `upstream` span (admission wait, new connection, the
# region's first byte); every other span follows the one before it.
INSIDE_UPSTREAM = {"queue", "connect", "region_ttft"}


def assert_spans_fit(t: dict[str, float]) -> None:
    """Sequential stages add up to no more than the total (or TTFT, for a stream's headers)."""
    end = t.get("total", t["ttft"])
    spans = {k: v for k, v in t.items() if k not in {"ttft", "total", *INSIDE_UPSTREAM}}
    assert sum(spans.values()) <= end + 0.001 * len(spans), t
    for stage in INSIDE_UPSTREAM & t.keys():
        assert t[stage] <= t["upstream"] + 0.001, t
    assert t["ttft"] <= end


@dataclass
class Env:
    a: Proc
    b: Proc
    cached: Proc
    plain: Proc


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp: Path = tmp_path_factory.mktemp("metrics")
    a = start_sim(tmp, "a")
    b = start_sim(tmp, "b")
    regions = region_toml(a) + region_toml(b, bias_ms=50.0)
    cached = start_router(tmp, HEADER + CACHE + regions)
    plain = start_router(tmp, HEADER + regions)
    yield Env(a, b, cached, plain)
    for proc in (cached, plain, a, b):
        proc.kill()


def test_known_sequence_is_reflected_exactly(env: Env) -> None:
    r = env.cached
    answers = [
        chat(r, "first", temperature=0),  # miss, region a
        chat(r, "second", temperature=0),  # miss, region a
        chat(r, "first", temperature=0),  # hit: no region
        chat(r, "streamed", stream=True),  # unset temperature: bypass, streamed from a
        call(
            r.url + "/v1/chat/completions",
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        ),  # 404
        call(r.url + "/v1/chat/completions", b"{not json"),  # 400
    ]
    sim_config(env.a, fail_mode="503")
    try:
        answers.append(chat(r, "third", temperature=0))  # a answers 503: failover to b
    finally:
        sim_config(env.a, fail_mode="none")
    assert [a.status for a in answers] == [200, 200, 200, 200, 404, 400, 200]
    for answer in answers:
        assert_spans_fit(answer.timing())
    assert [a.headers.get("x-cache") for a in answers[:4]] == ["MISS", "MISS", "HIT", "BYPASS"]

    m = samples(r)
    requests = {
        (dict(labels)["region"], dict(labels)["model"], dict(labels)["status"],
         dict(labels)["cache"]): v
        for (name, labels), v in m.items()
        if name == "router_requests_total"
    }  # fmt: skip
    assert requests == {
        ("a", MODEL, "200", "miss"): 2,
        ("none", MODEL, "200", "hit"): 1,
        ("a", MODEL, "200", "bypass"): 1,
        ("none", "_other", "404", "none"): 1,  # a made-up model name is not a label
        ("none", "none", "400", "none"): 1,
        ("b", MODEL, "200", "miss"): 1,
    }
    assert value(m, "router_cache_hits_total") == 1
    assert value(m, "router_cache_misses_total") == 3
    assert value(m, "router_failovers_total") == 1
    assert value(m, "router_retries_total") == 0
    assert value(m, "router_rate_limited_total") == 0
    # Every request has a total; only answered ones reached a region.
    assert value(m, "router_stage_seconds_count", stage="total") == 7
    assert value(m, "router_stage_seconds_count", stage="region_ttft") == 4
    # Every stage Server-Timing shows has its histogram: parsed (every request, the 404 and
    # the 400 refused inside that stage too), sent upstream (not the hit), relayed as a stream.
    assert value(m, "router_stage_seconds_count", stage="parse") == 7
    assert value(m, "router_stage_seconds_count", stage="upstream") == 4
    assert value(m, "router_stage_seconds_count", stage="stream") == 1
    miss_a = {"region": "a", "model": MODEL, "status": "200", "cache": "miss"}
    assert value(m, "router_ttft_seconds_count", **miss_a) == 2
    assert value(m, "router_request_duration_seconds_count", **miss_a) == 2
    assert value(m, "router_request_duration_seconds_bucket", **miss_a, le="60.0") == 2
    # a answered (a 503 is an answer), so the request path saw both regions reachable.
    assert value(m, "router_region_healthy", region="a") == 1
    assert value(m, "router_region_healthy", region="b") == 1
    assert value(m, "router_slo_compliant", region="all", objective="error_rate") == 1
    # Scraping is not a request: a second scrape counts the same.
    assert samples(r)[("router_requests_total", frozenset(miss_a.items()))] == 2

    log = r.access_lines(7)
    assert len([ln for ln in r.output().splitlines() if is_access_line(ln)]) == 7
    assert [line["status"] for line in log] == [200, 200, 200, 200, 404, 400, 200]
    assert [line["cache"] for line in log[:4]] == ["miss", "miss", "hit", "bypass"]
    assert log[6]["region"] == "b"
    assert log[6]["attempts"] == 2
    assert log[6]["failovers"] == 1
    assert log[0]["tokens_in"] is not None
    assert log[0]["tokens_out"] is not None
    assert log[3]["stream"] is True
    for line, answer in zip(log, answers, strict=True):
        assert line["request_id"] == answer.headers["x-request-id"]
    assert SECRET not in r.output()


def test_server_timing_on_every_answer_and_consistent(env: Env) -> None:
    r = env.plain
    whole = chat(r, "whole")
    stream = chat(r, "stream me", stream=True)
    bad = call(r.url + "/v1/chat/completions", b"[]")
    unknown_path = call(r.url + "/v1/nothing", {})
    for answer in (whole, stream, bad, unknown_path):
        t = answer.timing()
        assert_spans_fit(t)
        assert t["ttft"] >= 0
        for stage, ms in t.items():
            assert ms <= t.get("total", t["ttft"]) + 0.001, (stage, t)
    t = whole.timing()
    assert t["ttft"] == t["total"]  # a whole body leaves at once
    # This router's first request opened a connection to the region; the next one reuses it.
    assert 0 < t["connect"] <= t["region_ttft"]
    # The request's own spans run one after another, so together they fit in the total.
    assert t["parse"] + t["upstream"] <= t["total"]
    assert t["region_ttft"] <= t["upstream"]
    # A stream's headers go out before its body: TTFT is known there, the total is not.
    s = stream.timing()
    assert "connect" not in s
    assert "total" not in s
    assert "stream" not in s
    assert s["parse"] + s["upstream"] <= s["ttft"]
    assert bad.status == 400
    assert unknown_path.status == 404


def test_request_id_is_accepted_or_generated(env: Env) -> None:
    r = env.plain
    body = {"model": MODEL, "messages": [{"role": "user", "content": "id"}]}
    given = call(r.url + "/v1/chat/completions", body, {"X-Request-Id": "client-id-42"})
    assert given.headers["x-request-id"] == "client-id-42"
    made = call(r.url + "/v1/chat/completions", body, {"X-Request-Id": "bad id with spaces"})
    assert made.headers["x-request-id"] != "bad id with spaces"
    assert len(made.headers["x-request-id"]) >= 16
    log = r.wait_output(made.headers["x-request-id"])
    assert '"request_id":"client-id-42"' in log


def test_status_json_and_page(env: Env) -> None:
    r = env.plain
    chat(r, "status")
    with urllib.request.urlopen(r.url + "/status.json", timeout=5) as resp:
        doc = json.loads(resp.read())
    assert [region["name"] for region in doc["regions"]] == ["a", "b"]
    assert doc["slo"]["ttft_p95_target_ms"] == 200.0
    assert doc["overall"]["requests"] >= 1
    with urllib.request.urlopen(r.url + "/status", timeout=5) as resp:
        page = resp.read().decode()
        assert resp.headers["Content-Type"].startswith("text/html")
    assert "/status.json" in page
    for path in ("/metrics", "/status", "/status.json"):
        wrong = call(r.url + path, {"x": 1})  # POST where only GET is served
        assert wrong.status == 405
        assert json.loads(wrong.body)["error"]["type"] == "invalid_request_error"
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # no external assets


def test_auth_and_rate_limit_answers_are_counted(tmp_path: Path, sim_region: Any) -> None:
    a = sim_region("a")
    key = "sk-tenant-key-0123456789"
    auth = f"""
[[auth.keys]]
sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"
tenant = "acme"
requests_per_minute = 2
request_burst = 2
"""
    router = start_router(tmp_path, "[auth]\nenabled = true\n" + auth + region_toml(a))
    try:
        url = router.url + "/v1/chat/completions"
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        good = {"Authorization": f"Bearer {key}"}
        codes = [
            call(url, body).status,
            call(url, body, {"Authorization": "Bearer sk-wrong-key-000000"}).status,
            call(url, body, good).status,
            call(url, body, good).status,
            call(url, body, good).status,
        ]
        assert codes == [401, 401, 200, 200, 429]
        m = samples(router)
        by_status = {
            dict(labels)["status"]: v
            for (name, labels), v in m.items()
            if name == "router_requests_total"
        }
        assert by_status == {"401": 2, "200": 2, "429": 1}
        assert value(m, "router_rate_limited_total") == 1
        # Per tenant (the unauthenticated ones as "none"), and tokens per model and region.
        assert value(m, "router_tenant_requests_total", tenant="acme") == 3
        assert value(m, "router_tenant_requests_total", tenant="none") == 2
        assert value(m, "router_tenant_rate_limited_total", tenant="acme") == 1
        tokens_out = value(m, "router_tenant_tokens_total", tenant="acme", direction="out")
        assert tokens_out is not None
        assert tokens_out > 0
        spent = value(m, "router_tokens_total", model=MODEL, region="a", direction="out")
        assert spent == tokens_out
        # The process and what runs.
        for name in ("process_resident_memory_bytes", "process_open_fds"):
            measured = value(m, name)
            assert measured is not None
            assert measured > 0, name
        assert value(m, "process_cpu_seconds_total") is not None
        assert value(m, "python_gc_collections_total", generation="0") is not None
        (info,) = [labels for (name, labels) in m if name == "router_build_info"]
        assert dict(info)["version"]
        assert dict(info)["commit"]
        assert value(m, "router_config_generation") == 0
        log = router.access_lines(len(codes))
        assert [line["status"] for line in log] == codes
        assert [line.get("tenant") for line in log] == [None, None, "acme", "acme", "acme"]
        assert key not in router.output()
        assert "sk-wrong-key-000000" not in router.output()
    finally:
        router.kill()


def test_router_top_prints_the_regions(env: Env) -> None:
    out = subprocess.run(
        router_cmd("top", "--once", "--url", env.plain.url),
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert lines[0].startswith("router status at")
    assert [line.split()[0] for line in lines[5:]] == ["a", "b"]


def test_region_gauges_come_from_the_prober(env: Env) -> None:
    deadline = time.monotonic() + 15.0
    m = samples(env.plain)
    while time.monotonic() < deadline and value(m, "router_region_rtt_seconds", region="b") is None:
        time.sleep(0.2)
        m = samples(env.plain)
    for region in ("a", "b"):
        rtt = value(m, "router_region_rtt_seconds", region=region)
        assert rtt is not None
        assert 0 < rtt < 1.0
        assert value(m, "router_region_healthy", region=region) == 1
        assert value(m, "router_region_in_flight", region=region) == 0
        assert value(m, "router_region_queue_depth", region=region) == 0
        assert value(m, "router_region_ejections_total", region=region) == 0
    with urllib.request.urlopen(env.plain.url + "/status.json", timeout=5) as resp:
        doc = json.loads(resp.read())
    assert all(r["rtt_ms"] is not None and r["healthy"] is True for r in doc["regions"])


def test_a_hedge_is_counted_not_a_failover(tmp_path: Path, sim_region: Any) -> None:
    slow = sim_region("slow", rtt_ms=400)
    fast = sim_region("fast")
    config = (
        HEADER
        + '\n[routing]\nhedge_endpoints = ["/v1/chat/completions"]\nhedge_delay_ms = 50\n'
        + region_toml(slow)
        + region_toml(fast, bias_ms=50.0)
    )
    router = start_router(tmp_path, config)
    try:
        answer = chat(router, "hedge me")
        assert answer.status == 200
        m = samples(router)
        assert value(m, "router_hedges_total") == 1
        assert value(m, "router_failovers_total") == 0
        (line,) = router.access_lines(1)
        # Zero counts are left out of the line.
        assert (line["hedges"], line.get("failovers", 0), line["attempts"]) == (1, 0, 2)
    finally:
        router.kill()


def _reported(raw: bytes) -> tuple[int | None, int | None]:
    """(input, output) tokens a stream's own events report: the latest count of each."""
    prompt = completion = None
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        doc = json.loads(line[6:])
        for holder in (doc, doc.get("response") or {}, doc.get("message") or {}):
            used = holder.get("usage") if isinstance(holder, dict) else None
            if isinstance(used, dict):
                prompt = used.get("prompt_tokens", used.get("input_tokens", prompt))
                completion = used.get("completion_tokens", used.get("output_tokens", completion))
    return prompt, completion


def test_streams_count_the_tokens_they_report(tmp_path: Path, sim_region: Any) -> None:
    a = sim_region("a")
    router = start_router(tmp_path, HEADER + region_toml(a))
    try:
        message = [{"role": "user", "content": "count these tokens please"}]
        sent = [
            (
                "/v1/chat/completions",
                {"messages": message, "stream_options": {"include_usage": True}},
            ),
            ("/v1/responses", {"input": "count these tokens please"}),
            ("/v1/messages", {"messages": message, "max_tokens": 16}),
            ("/v1/chat/completions", {"messages": message}),  # reports none: counts none
        ]
        reported = []
        for path, body in sent:
            answer = call(router.url + path, {"model": MODEL, "stream": True, **body})
            assert answer.status == 200, answer.body
            reported.append(_reported(answer.body))
        assert all(None not in pair for pair in reported[:3]), reported
        assert reported[3] == (None, None)
        log = router.access_lines(len(sent))
        assert [(line.get("tokens_in"), line.get("tokens_out")) for line in log] == reported
        m = samples(router)
        for direction, index in (("in", 0), ("out", 1)):
            total = sum(pair[index] or 0 for pair in reported)
            assert (
                value(m, "router_tokens_total", model=MODEL, region="a", direction=direction)
                == total
            )
    finally:
        router.kill()


def test_cache_hits_count_tokens_as_documented(tmp_path: Path, sim_region: Any) -> None:
    """A whole answer's hit counts what it holds, under region "none"; a replayed stream none."""
    a = sim_region("a")
    router = start_router(tmp_path, HEADER + CACHE + region_toml(a))
    try:
        whole = [chat(router, "count me", temperature=0) for _ in range(2)]
        usage = {"stream_options": {"include_usage": True}}
        streams = [chat(router, "count me", temperature=0, stream=True, **usage) for _ in range(2)]
        assert [w.headers["x-cache"] for w in whole + streams] == ["MISS", "HIT", "MISS", "HIT"]
        held = json.loads(whole[1].body)["usage"]
        assert _reported(streams[1].body) == _reported(streams[0].body) != (None, None)
        log = router.access_lines(4)
        tokens = [(line.get("tokens_in"), line.get("tokens_out")) for line in log]
        assert tokens[1] == (held["prompt_tokens"], held["completion_tokens"])
        assert tokens[3] == (None, None)
        m = samples(router)
        out = value(m, "router_tokens_total", model=MODEL, region="none", direction="out")
        assert out == held["completion_tokens"]
    finally:
        router.kill()


def test_a_stream_broken_mid_way_is_counted_as_a_failure(tmp_path: Path, sim_region: Any) -> None:
    a = sim_region("a")
    router = start_router(tmp_path, HEADER + region_toml(a))
    try:
        url = router.url + "/v1/chat/completions"
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        whole = call(url, body)
        cut = call(url, body, {"x-sim-fail": "die-mid-stream", "x-sim-after-tokens": "3"})
        assert (whole.status, cut.status) == (200, 200)  # the cut one's head went out first
        assert whole.body.endswith(b"data: [DONE]\n\n")
        assert b"upstream_stream_error" in cut.body
        assert b"[DONE]" not in cut.body
        good, broken = router.access_lines(2)
        assert "error" not in good
        assert broken["status"] == 200
        assert "stopped mid-stream" in broken["error"]
        # A model without versions is routed as one version named after it.
        assert good["version"] == broken["version"] == MODEL
        m = samples(router)
        assert value(m, "router_stream_failures_total", region="a", model=MODEL) == 1
        # A client's own error (here a body that is not JSON) counts for neither objective.
        for _ in range(5):
            assert call(url, b"{not json").status == 400
        with urllib.request.urlopen(router.url + "/status.json", timeout=5) as resp:
            overall = json.loads(resp.read())["overall"]
        assert (overall["requests"], overall["errors"]) == (2, 1)
    finally:
        router.kill()


def test_a_model_a_reload_adds_is_labelled_as_itself(tmp_path: Path, sim_region: Any) -> None:
    a = sim_region("a")
    admin = "admin-token-0123456789abcdef"
    token = hashlib.sha256(admin.encode()).hexdigest()
    head = f'[auth]\nenabled = false\nadmin_token_sha256 = "{token}"\n'
    router = start_router(tmp_path, head + region_toml(a))
    path = tmp_path / f"router-{router.port}.toml"
    try:
        path.write_text(path.read_text() + f'\n[models]\naliases = {{ "newalias" = "{MODEL}" }}\n')
        req = urllib.request.Request(
            router.url + "/admin/reload",
            method="POST",
            headers={"Authorization": f"Bearer {admin}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        body = {"model": "newalias", "messages": [{"role": "user", "content": "hi"}]}
        assert call(router.url + "/v1/chat/completions", body).status == 200
        assert call(router.url + "/v1/chat/completions", {**body, "model": "nope"}).status == 404
        by_model = {
            dict(labels)["model"]: v
            for (name, labels), v in samples(router).items()
            if name == "router_requests_total"
        }
        assert by_model == {"newalias": 1, "_other": 1}
    finally:
        router.kill()
