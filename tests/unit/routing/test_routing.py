"""Routing policy pieces: client deadline, retry gate, first-byte timeout, health outcomes."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import pytest
from multidict import CIMultiDict

from router.config import Config, HealthConfig, RegionConfig, RoutingConfig
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind, Origin, health_outcome
from router.core.open_streams import OpenStreams
from router.core.request import CHAT, parse_body
from router.core.transport import LocalReply, LocalTransport
from router.core.upstream import Upstream, Upstreams
from router.routing.circuit import Circuits
from router.routing.health import Health, outcome_of
from router.routing.runtime import (
    LiveRouting,
    PassiveHealth,
    RetryState,
    client_deadline,
    selector,
)


def _first_byte(passive: PassiveHealth, ctx: RequestContext, region: Upstream, s: float) -> None:
    """A stream's first byte from `region`, as the attempt path tells it (Attempts.observe)."""
    ctx.streaming.append((region.name, ctx.request.upstream_model, s))
    passive(ctx, region, None, s)


def test_client_deadline_from_headers() -> None:
    assert client_deadline({}, 100.0) is None
    assert client_deadline({"x-stainless-timeout": "600"}, 100.0) == 700.0
    assert client_deadline({"x-router-timeout-ms": "250"}, 100.0) == pytest.approx(100.25)
    # The Python SDK's read timeout: the router sends nothing while it waits, so it is a deadline.
    assert client_deadline({"x-stainless-read-timeout": "30"}, 100.0) == 130.0
    for bad in ("abc", "-1", "0", "nan", "inf"):
        assert client_deadline({"x-stainless-timeout": bad}, 1.0) is None


def test_retry_gate_caps_attempts_budget_and_deadline() -> None:
    live = LiveRouting(RoutingConfig(max_attempts=3, retry_budget_ratio=0.0, retry_budget_min=2))
    gate = RetryState(live).allow
    ctx = RequestContext("r", "/v1/chat/completions")
    assert gate(ctx)  # the first attempt is always allowed (and counted as a request)
    ctx.attempts = 1
    assert gate(ctx)
    ctx.attempts = 3
    assert not gate(ctx)  # max_attempts
    ctx.attempts = 1
    assert gate(ctx)
    assert not gate(ctx)  # budget: min_retries = 2 spent
    other = RequestContext("s", "/v1/chat/completions")
    other.attempts = 1
    other.deadline = time.monotonic() - 1.0
    roomy = RetryState(LiveRouting(RoutingConfig())).allow
    assert not roomy(other)


def test_first_byte_timeout_uses_routing_then_deadline() -> None:
    ctx = RequestContext("r", "/v1/chat/completions")
    assert RetryState(LiveRouting(RoutingConfig())).first_byte(ctx, 30.0) == 30.0
    tight = LiveRouting(RoutingConfig(ttft_timeout_s=2.0))
    assert RetryState(tight).first_byte(ctx, 30.0) == 2.0
    ctx.deadline = time.monotonic() + 0.5
    assert 0.0 < RetryState(tight).first_byte(ctx, 30.0) <= 0.5
    ctx.deadline = time.monotonic() - 5
    assert RetryState(LiveRouting(RoutingConfig())).first_byte(ctx, 30.0) == 0.001


def test_outcomes_for_health() -> None:
    assert outcome_of(None, None) == "ok"
    assert outcome_of("connect", None) == "connect_error"
    assert outcome_of("timeout", None) == "timeout"
    assert outcome_of("status", 503) == "server_error"
    assert outcome_of("status", 429) == "neutral"
    assert outcome_of("disconnect", None) == "server_error"


def test_reload_swaps_the_section_and_keeps_an_unchanged_budget() -> None:
    region = RegionConfig(name="a", base_url="http://127.0.0.1:9", models=("m",))
    old = Config(regions=(region,), routing=RoutingConfig(max_attempts=3))
    live = LiveRouting(old.routing)
    seen: list[RoutingConfig] = []
    live.on_change.append(seen.append)
    budget = live.budget
    same = Config(regions=(region,), routing=RoutingConfig(max_attempts=3))
    live.prepare(old, same)()
    assert seen == []
    new = Config(regions=(region,), routing=RoutingConfig(max_attempts=1, midstream="resume"))
    commit = live.prepare(old, new)
    assert live.config.max_attempts == 3  # nothing changes before the commit
    commit()
    assert live.config.max_attempts == 1
    assert live.budget is budget
    assert seen == [new.routing]
    newer = Config(regions=(region,), routing=RoutingConfig(retry_budget_min=1))
    live.prepare(new, newer)()
    assert live.budget is not budget
    assert live.budget.min_retries == 1


def test_a_reloaded_routing_section_retunes_the_circuits_and_keeps_their_state() -> None:
    region = RegionConfig(name="a", base_url="http://127.0.0.1:1/v1", models=("m",))
    old = Config(regions=(region,), routing=RoutingConfig(circuit_after=1, circuit_base_s=5.0))
    live = LiveRouting(old.routing)
    assert live.circuits.record("a", "m", ok=False, now=0.0)  # open for 5 s
    slower = RoutingConfig(circuit_after=1, circuit_base_s=20.0, circuit_max_s=40.0)
    live.prepare(old, Config(regions=(region,), routing=slower))()
    assert not live.circuits.closed("a", "m", now=4.0)  # still the open circuit it was
    assert live.circuits.closed("a", "m", now=5.0)  # its trial, at the old deadline
    assert live.circuits.record("a", "m", ok=False, now=10.0)
    # Opened a second time: 20 s * 2, capped at the new 40 s.
    assert [round(left) for *_, left in live.circuits.open_pairs(10.0)] == [40]


def test_a_reload_with_circuits_that_cannot_be_refuses_before_changing_anything() -> None:
    region = RegionConfig(name="a", base_url="http://127.0.0.1:1/v1", models=("m",))
    old = Config(regions=(region,))
    live = LiveRouting(old.routing)
    bad = RoutingConfig(circuit_base_s=50.0, circuit_max_s=10.0, max_attempts=1)
    with pytest.raises(ValueError, match="base_s <= max_s"):
        live.prepare(old, Config(regions=(region,), routing=bad))
    assert live.config is old.routing
    assert live.circuits.base_s == 5.0


async def _never(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
    raise AssertionError("no request is sent")


def _idle_upstream(config: RegionConfig) -> Upstream:
    """A region for the health and circuit bookkeeping alone: nothing is sent to it."""
    return Upstream(config, LocalTransport(_never), None)


def test_a_stream_counts_for_its_region_when_it_ends_and_once() -> None:
    """A stream's first byte is not yet a success: a region cutting every stream after it
    builds up failures (ejection, the model's circuit); one that goes through resets them and
    gives its TTFT. Each stream is one report, whichever way it ended."""
    region = RegionConfig(name="a", base_url="http://127.0.0.1:9/v1", models=("m",))
    health = Health(HealthConfig(eject_after=2), [region])
    circuits = Circuits(failures_to_open=2)
    passive = PassiveHealth(health, circuits)

    a = _idle_upstream(region)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}'

    streams = OpenStreams(passive)

    def stream(broken: bool) -> None:
        ctx = RequestContext("r", CHAT)
        ctx.parsed = parse_body(CHAT, body)
        _first_byte(passive, ctx, a, 0.05)
        if broken:
            streams.broke(ctx, "a")
        streams.ended(ctx)

    def state() -> tuple[int, int, int]:
        h = health.snapshot()["a"]
        return h.passive_reports, h.passive_failures, h.ejections

    stream(broken=True)
    assert state() == (1, 1, 0)  # one break: one failure, no ejection at eject_after = 2
    assert health.snapshot()["a"].ewma_ttft_s is None
    stream(broken=False)
    assert state() == (2, 0, 0)
    assert health.snapshot()["a"].ewma_ttft_s == pytest.approx(0.05)
    assert circuits.closed("a", "m", time.monotonic())
    stream(broken=True)
    stream(broken=True)
    assert state() == (4, 0, 1)  # ejected (its count starts again)
    assert not circuits.closed("a", "m", time.monotonic())


def _trial_setup() -> tuple[Health, Circuits, PassiveHealth, Upstream, Upstream, Upstreams]:
    """Regions a (nearest) and b serving m; a's circuit for m due for its trial."""
    a_config = RegionConfig(name="a", base_url="http://127.0.0.1:9/v1", models=("m",))
    b_config = RegionConfig(name="b", base_url="http://127.0.0.1:9/v1", models=("m",), bias_ms=50)
    health = Health(HealthConfig(), [a_config, b_config])
    circuits = Circuits(failures_to_open=1, base_s=5.0, max_s=30.0)
    assert circuits.record("a", "m", False, time.monotonic() - 100.0)  # open, and long due

    a = _idle_upstream(a_config)
    b = _idle_upstream(b_config)
    return health, circuits, PassiveHealth(health, circuits), a, b, Upstreams((a, b))


def _request(stream: bool = False) -> RequestContext:
    ctx = RequestContext("r", CHAT)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ctx.parsed = parse_body(CHAT, json.dumps(body).encode())
    return ctx


def _names(regions: Sequence[Upstream]) -> list[str]:
    return [u.name for u in regions]


@pytest.mark.parametrize(
    ("error", "then"),
    [
        pytest.param(None, "closed", id="success"),
        pytest.param(AttemptError("a", FailureKind.STATUS, "500", status=500), "open", id="500"),
        pytest.param(AttemptError("a", FailureKind.INVALID, "html"), "open", id="invalid"),
        pytest.param(
            AttemptError("a", FailureKind.TIMEOUT, "no first byte"), "open", id="first-byte-timeout"
        ),
        pytest.param(AttemptError("a", FailureKind.CONNECT, "refused"), "open", id="connect"),
        pytest.param(AttemptError("a", FailureKind.DISCONNECT, "reset"), "open", id="disconnect"),
        pytest.param(
            AttemptError("a", FailureKind.SPILL, "full", origin=Origin.INTERNAL), "due", id="spill"
        ),
        pytest.param(
            AttemptError("a", FailureKind.REQUEST, "400", status=400, retryable=False),
            "due",
            id="request-fault",
        ),
        pytest.param(
            AttemptError("a", FailureKind.UNSUPPORTED, "no images", status=500),
            "due",
            id="unsupported",
        ),
        pytest.param(AttemptError("a", FailureKind.STATUS, "429", status=429), "due", id="429"),
        pytest.param("cancelled", "due", id="cancelled"),
        pytest.param("never sent", "due", id="never-sent"),
    ],
)
def test_every_ending_of_a_half_open_trial_settles_it(
    error: AttemptError | str | None, then: str
) -> None:
    """The request the selector gave a's trial to settles it however its attempt ended:
    closed (success), open again (a failure of the region: an error answer, silence, no
    connection) or due again for the next request (nothing said of the region: a full
    admission queue, the request's own fault, a 429, the client gone, served elsewhere)."""
    health, circuits, passive, a, b, upstreams = _trial_setup()
    select = selector(health, LiveRouting(RoutingConfig()), circuits)
    trial = _request()
    assert _names(select(trial, upstreams)) == ["a", "b"]  # a's trial: a in its usual place
    assert _names(select(_request(), upstreams)) == ["b", "a"]  # one trial at a time
    if isinstance(error, AttemptError):
        passive(trial, a, error, 0.1)
    elif error is None:
        passive(trial, a, None, 0.1)
    elif error == "never sent":
        passive(trial, b, None, 0.1)  # b answered first (say a was nearer, then not)
    # "cancelled": the attempt at a never reports; only the request's end does.
    passive.ended(trial)
    expected = {"closed": ["a", "b"], "due": ["a", "b"], "open": ["b", "a"]}[then]
    assert _names(select(_request(), upstreams)) == expected
    if then == "due":
        assert _names(select(_request(), upstreams)) == ["b", "a"]  # taken by that request
    now = time.monotonic()
    left = {region: s for region, _, s in circuits.open_pairs(now)}
    if then == "open":
        assert 9.0 < left["a"] <= 10.0  # its second opening: 2 * circuit_base_s
    elif then == "closed":
        assert left == {}


@pytest.mark.parametrize("broken", [False, True])
def test_a_streamed_trial_settles_when_the_stream_ends(broken: bool) -> None:
    health, circuits, passive, a, _, upstreams = _trial_setup()
    select = selector(health, LiveRouting(RoutingConfig()), circuits)
    trial = _request(stream=True)
    assert _names(select(trial, upstreams)) == ["a", "b"]
    streams = OpenStreams(passive)
    _first_byte(passive, trial, a, 0.1)  # not yet a success, the trial still held
    assert _names(select(_request(), upstreams)) == ["b", "a"]
    if broken:
        streams.broke(trial, "a")
    streams.ended(trial)
    assert _names(select(_request(), upstreams)) == (["b", "a"] if broken else ["a", "b"])


def test_a_region_shedding_load_is_held_and_counts_no_failure() -> None:
    """A 503 with Retry-After sends the pair last for that long, and is no failure of the model
    there: circuit_after such answers do not open its circuit (README: Passive signals)."""
    region = RegionConfig(name="a", base_url="http://127.0.0.1:9/v1", models=("m",))
    health = Health(HealthConfig(), [region])
    circuits = Circuits(failures_to_open=2, base_s=5.0, max_s=30.0)
    passive = PassiveHealth(health, circuits)

    a = _idle_upstream(region)
    shed = AttemptError("a", FailureKind.STATUS, "503", status=503, retry_after_s=0.001)
    for _ in range(3):
        passive(_request(), a, shed, 0.1)
        time.sleep(0.002)  # the hold runs out
        assert circuits.closed("a", "m", time.monotonic())
    # Without Retry-After the same answers are failures: the second opens the circuit.
    failing = AttemptError("a", FailureKind.STATUS, "503", status=503)
    passive(_request(), a, failing, 0.1)
    assert circuits.closed("a", "m", time.monotonic())
    passive(_request(), a, failing, 0.1)
    assert not circuits.closed("a", "m", time.monotonic())
    assert health.snapshot()["a"].passive_failures == 0  # answered: not the region's health


def test_a_region_without_the_model_counts_against_that_circuit_never_the_region() -> None:
    """A region answering it has no such model (its config drifted) is up: the failure is the
    model's there (its circuit opens, other regions go first), never the region's health (no
    passive failure, no ejection, its other models untouched)."""
    region = RegionConfig(name="a", base_url="http://127.0.0.1:9/v1", models=("m", "n"))
    health = Health(HealthConfig(eject_after=2), [region])
    circuits = Circuits(failures_to_open=3)
    passive = PassiveHealth(health, circuits)

    a = _idle_upstream(region)
    ctx = RequestContext("r", CHAT)
    ctx.parsed = parse_body(CHAT, b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}')
    unserved = AttemptError("a", FailureKind.UNSERVED, "HTTP 404", status=404)
    assert health_outcome(FailureKind.UNSERVED, 404) == "neutral"
    for _ in range(3):
        passive(ctx, a, unserved, 0.01)
    now = time.monotonic()
    assert not circuits.closed("a", "m", now)
    assert circuits.closed("a", "n", now)
    h = health.snapshot()["a"]
    assert (h.passive_reports, h.passive_failures, h.ejections) == (3, 0, 0)
