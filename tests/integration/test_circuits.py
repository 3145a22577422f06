"""(Region, model) circuits end to end (a real router, real sim regions): however a half-open
trial ends, the region gets the model's traffic back once it is well; a region shedding load
with Retry-After is left alone that long and counts no failure."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests.integration.conftest import (
    MODEL,
    RouterFactory,
    SimFactory,
    region_toml,
    sim_stats,
)
from tests.support import Proc

# One request a region answers at once; a's circuit opens for 0.5 s after 3 failures, at most
# 30 s: a trial left hanging is only ever given back by its request, never by its lease
# lapsing within the test.
ROUTING = """[auth]
enabled = false
[health]
interval_s = 0.5
[routing]
circuit_after = 3
circuit_base_s = 0.5
circuit_max_s = 30.0
"""
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
FAIL_AT_A = {"x-sim-fail": "500", "x-sim-only": "a"}


def _region(router: Proc, headers: dict[str, str] | None = None, timeout: float = 10.0) -> str:
    """POST one chat request; the region that answered it (x-router-region), "aborted" when
    the client gave up first."""
    request = urllib.request.Request(
        router.url + "/v1/chat/completions",
        data=BODY,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            resp.read()
            return str(resp.headers["x-router-region"])
    except urllib.error.HTTPError as exc:
        return str(exc.headers.get("x-router-region"))
    except TimeoutError:
        return "aborted"
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            return "aborted"
        raise


def _two(
    sim_region: SimFactory, router_proc: RouterFactory, routing: str = ""
) -> tuple[Proc, Proc]:
    """A router whose traffic goes to region a (nearest) before b; the router and a."""
    a, b = sim_region("a"), sim_region("b")
    router = router_proc(ROUTING + routing + region_toml(a) + region_toml(b, bias_ms=200))
    for _ in range(100):
        if _region(router) == "a":
            return router, a
        time.sleep(0.1)  # until the prober has measured both
    raise AssertionError("a never took the traffic")


def _back_to_a(router: Proc) -> list[str]:
    """Healthy requests, one every 0.25 s, until one is answered by a (at most 40)."""
    answered: list[str] = []
    for _ in range(40):
        answered.append(_region(router))
        if answered[-1] == "a":
            break
        time.sleep(0.25)
    return answered


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ending", ["client-abort", "first-byte-timeout"])
def test_a_half_open_trial_that_gets_no_answer_does_not_keep_the_region_out(
    ending: str, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    """The reviewer's case: a's circuit opens, its trial request is cut off (its client gives
    up, or a stays silent past ttft_timeout_s), then a is well again. The trial must end (given
    back, or failed and opened again for longer) so that a later request tries a and closes
    the circuit; before, it stayed "in flight" for good and every request went to b."""
    routing = "ttft_timeout_s = 1.0\n" if ending == "first-byte-timeout" else ""
    router, _ = _two(sim_region, router_proc, routing)
    assert [_region(router, FAIL_AT_A) for _ in range(3)] == ["b"] * 3
    assert _region(router) == "b"  # open: a goes last
    time.sleep(1.0)  # past circuit_base_s: a's trial is due
    if ending == "client-abort":
        # The trial goes to a (its usual place), which answers only after 3 s; the client
        # leaves after 0.5 s.
        assert _region(router, {"x-sim-rtt-ms": "3000"}, timeout=0.5) == "aborted"
    else:
        # a holds the trial without a first byte: failed over to b after 1 s.
        assert _region(router, {"x-sim-fail": "hang", "x-sim-only": "a"}) == "b"
    answered = _back_to_a(router)
    assert answered[-1] == "a", answered
    assert [_region(router) for _ in range(5)] == ["a"] * 5  # closed again


@pytest.mark.timeout(60)
def test_retry_after_holds_the_region_and_counts_no_failure_against_its_circuit(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    """a answers 503 with Retry-After: 1 (the sim's) three times, each after the last hold ran
    out: those are no failures (README: shedding load is not failing), so one 500 after them
    leaves a's circuit closed (circuit_after = 3). Before, each 503 was counted as well, and
    that 500 opened the circuit."""
    router, a = _two(sim_region, router_proc)
    shed = {"x-sim-fail": "503", "x-sim-only": "a"}
    for _ in range(3):
        seen = sim_stats(a)["requests"]
        assert _region(router, shed) == "b"
        assert sim_stats(a)["requests"] == seen + 1  # a got it (and was held after it)
        assert _region(router) == "b"  # held: a goes last for its Retry-After
        time.sleep(1.2)
    assert _region(router, FAIL_AT_A) == "b"
    assert _region(router) == "a"
