"""A real router in front of sim regions: /status.json and /metrics count what each region did
with the attempts it got, not only which region answered each request in the end.

Review findings: a region that failed attempts another region then served showed no errors at
all (/status.json errors 0, no server-error series in /metrics), and the router's own admission
sheds (503 overloaded, the region never saw them) showed as the region's errors.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import MODEL, RouterFactory, SimFactory, region_toml
from tests.integration.test_metrics import samples
from tests.support import Proc

# Failed attempts at a must not open its circuit or eject it: a stays first in line, so every
# request tries a, then b.
HEADER = """
[auth]
enabled = false
[health]
interval_s = 0.2
eject_after = 100
[routing]
circuit_after = 100
[timeouts]
first_byte = 1.0
"""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _body(**extra: Any) -> bytes:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    ).encode()


def post(router: Proc, headers: dict[str, str], timeout: float = 30) -> tuple[int, dict[str, str]]:
    """One chat request; its status and headers (lowercase names)."""
    req = urllib.request.Request(
        router.url + "/v1/chat/completions",
        data=_body(),
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}


def status(router: Proc) -> dict[str, Any]:
    with urllib.request.urlopen(router.url + "/status.json", timeout=5) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def regions(router: Proc) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in status(router)["regions"]}


def value(metrics: Samples, name: str, **labels: str) -> float | None:
    return metrics.get((name, frozenset(labels.items())))


def until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Poll until `check()` holds (a readiness wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def probed(router: Proc, *names: str) -> bool:
    seen = regions(router)
    return all(seen.get(n, {}).get("rtt_ms") is not None for n in names)


def two_regions(sim_region: SimFactory, router_proc: RouterFactory) -> Proc:
    """Regions a and b, a first in line (b's bias), both probed."""
    a, b = sim_region("a"), sim_region("b")
    router = router_proc(HEADER + region_toml(a) + region_toml(b, bias_ms=200))
    until(lambda: probed(router, "a", "b"), "both regions probed")
    return router


@pytest.mark.parametrize(("fail", "outcome"), [("500", "server_error"), ("hang", "timeout")])
def test_attempts_a_region_failed_before_another_served_them_are_its_errors(
    sim_region: SimFactory, router_proc: RouterFactory, fail: str, outcome: str
) -> None:
    router = two_regions(sim_region, router_proc)
    n = 4
    for _ in range(n):
        code, headers = post(router, {"x-sim-fail": fail, "x-sim-only": "a"})
        assert (code, headers["x-router-region"], headers["x-router-attempts"]) == (200, "b", "2")
    seen = regions(router)
    a, b = seen["a"], seen["b"]
    # a answered none of the requests, and failed every attempt it got.
    assert (a["requests"], a["errors"], a["error_rate"], a["errors_ok"]) == (0, n, 1.0, False)
    assert (b["requests"], b["errors"], b["error_rate"]) == (n, 0, 0.0)
    m = samples(router)
    assert value(m, "router_region_attempts_total", region="a", outcome=outcome) == n
    assert (a["attempts"], a["shed"], b["attempts"]) == (n, 0, n)
    assert value(m, "router_region_attempts_total", region="a", outcome="ok") is None
    assert value(m, "router_region_attempts_total", region="b", outcome="ok") == n
    # The requests' own series are unchanged: b answered them all, 200.
    labels = {"model": MODEL, "cache": "none"}
    assert value(m, "router_requests_total", region="b", status="200", **labels) == n
    assert value(m, "router_requests_total", region="a", status="200", **labels) is None
    assert value(m, "router_server_errors_total", region="a") is None


def test_the_routers_own_admission_sheds_are_no_errors_of_the_region(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    a = sim_region("a")
    header = HEADER.replace("first_byte = 1.0", "first_byte = 60.0")
    header += "[admission]\nmax_in_flight = 1\nqueue_size = 0\n"
    router = router_proc(header + region_toml(a))
    until(lambda: probed(router, "a"), "region probed")
    # One request holds a's only slot (a never answers it); the others find admission full.
    holder = threading.Thread(
        target=lambda: _ignore_errors(lambda: post(router, {"x-sim-fail": "hang"}, timeout=90)),
        daemon=True,
    )
    holder.start()
    until(lambda: regions(router)["a"]["in_flight"] == 1, "a's slot taken")
    n = 5
    for _ in range(n):
        code, headers = post(router, {})
        assert code == 503
        assert "retry-after" in headers
    seen = regions(router)["a"]
    # a saw none of them: no error of a's, the sheds counted apart.
    assert (seen["errors"], seen["error_rate"], seen["errors_ok"]) == (0, None, True)
    assert seen["shed"] == n
    assert seen["requests"] == 0
    # The service still failed those clients: overall, they are errors.
    overall = status(router)["overall"]
    assert (overall["requests"], overall["errors"]) == (n, n)
    m = samples(router)
    assert value(m, "router_region_attempts_total", region="a", outcome="spill") == n
    assert value(m, "router_server_errors_total", region="a") is None
    assert value(m, "router_server_errors_total", region="none") == n
    labels = {"model": MODEL, "cache": "none"}
    assert value(m, "router_requests_total", region="none", status="503", **labels) == n
    assert value(m, "router_requests_total", region="a", status="503", **labels) is None


def _ignore_errors(call: Callable[[], object]) -> None:
    # The router is stopped under it at the end of the test.
    with contextlib.suppress(OSError):
        call()


def test_a_stream_that_broke_after_its_first_token_is_a_failed_attempt(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router = two_regions(sim_region, router_proc)
    host, port = "127.0.0.1", router.port
    headers = {
        "Content-Type": "application/json",
        "x-sim-fail": "die-mid-stream",
        "x-sim-only": "a",
        "x-sim-after-tokens": "2",
    }
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", _body(stream=True), headers)
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.status == 200
        assert resp.getheader("x-router-region") == "a"
    finally:
        conn.close()
    # midstream = "error" (the default): the client got the router's failure event.
    assert b"upstream_stream_error" in raw
    # A whole stream from b, for comparison.
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            _body(stream=True),
            {"Content-Type": "application/json", "x-sim-only": "a", "x-sim-fail": "500"},
        )
        resp = conn.getresponse()
        resp.read()
        assert (resp.status, resp.getheader("x-router-region")) == (200, "b")
    finally:
        conn.close()
    m = samples(router)
    assert value(m, "router_region_attempts_total", region="a", outcome="broken") == 1
    assert value(m, "router_region_attempts_total", region="a", outcome="server_error") == 1
    # The broken stream's first byte is not counted as a success as well.
    assert value(m, "router_region_attempts_total", region="a", outcome="ok") is None
    assert value(m, "router_region_attempts_total", region="b", outcome="ok") == 1
    a = regions(router)["a"]
    assert (a["attempts"], a["errors"]) == (2, 2)


def test_a_stream_read_on_for_the_cache_after_its_client_left_counts_how_it_ended(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    """A cache leader's client leaves mid-stream while a coalesced follower still reads: the
    router reads on for the follower. The region then breaks the stream: one broken attempt,
    not an ok one counted when the leader's handler ended (and never both)."""
    a = sim_region("a")
    router = router_proc(
        HEADER + "[cache]\nenabled = true\nmax_temperature = 1.0\n" + region_toml(a)
    )
    until(lambda: probed(router, "a"), "region probed")
    body = _body(stream=True, temperature=0)
    headers = {
        "Content-Type": "application/json",
        "x-sim-fail": "die-mid-stream",
        "x-sim-after-tokens": "12",
        "x-sim-tokens-per-s": "20",
    }

    def open_stream() -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        assert resp.status == 200
        return conn, resp

    leader_conn, leader = open_stream()
    leader.read1(1)  # the leader's stream is under way
    follower_conn, follower = open_stream()
    try:
        assert follower.getheader("x-cache") == "HIT"  # joined the leader's exchange
        follower.read1(1)
        leader_conn.sock.shutdown(2)  # type: ignore[union-attr]
        leader_conn.close()  # the leader's client leaves mid-stream
        raw = follower.read()
    finally:
        follower_conn.close()
    assert b"data: [DONE]" not in raw  # the region broke it: no clean end for the follower

    def counted() -> bool:
        m = samples(router)
        return value(m, "router_region_attempts_total", region="a", outcome="broken") == 1

    until(counted, "the broken stream counted")
    m = samples(router)
    assert value(m, "router_region_attempts_total", region="a", outcome="ok") is None
    assert regions(router)["a"]["errors"] == 1
