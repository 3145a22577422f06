"""Per-region attempt counts: outcomes, the rolling window, the request-level refusal, the
observer's stream bookkeeping and the workers' merge (no sockets)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from router.config import RegionConfig
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind
from router.core.open_streams import OpenStreams
from router.core.request import CHAT, parse_body
from router.core.transport import LocalReply, LocalTransport
from router.core.upstream import Upstream
from router.observability.access_log import AccessRecord
from router.observability.merge import merge_status
from router.observability.metrics import Telemetry
from router.observability.region_attempts import (
    FAILED,
    OUTCOMES,
    AttemptTotals,
    RegionAttempts,
    outcome_of,
)
from router.observability.slo import SloTargets, SloTracker
from router.observability.status import feed
from router.observability.telemetry import Observer, PassiveHealth, refused


def _error(kind: FailureKind, status: int | None = None) -> AttemptError:
    return AttemptError("a", kind, "x", status=status)


@pytest.mark.parametrize(
    ("error", "outcome", "failed"),
    [
        (None, "ok", False),
        (_error(FailureKind.STATUS, 500), "server_error", True),
        (_error(FailureKind.STATUS, 502), "server_error", True),
        (_error(FailureKind.STATUS, 429), "rate_limited", True),
        (_error(FailureKind.TIMEOUT), "timeout", True),
        (_error(FailureKind.CONNECT), "connect", True),
        (_error(FailureKind.DISCONNECT), "disconnect", True),
        (_error(FailureKind.INVALID), "invalid", True),
        (_error(FailureKind.TOO_LARGE), "too_large", True),
        # Not the region's failures: the router's admission, the request's own fault.
        (_error(FailureKind.SPILL, 503), "spill", False),
        (_error(FailureKind.REQUEST, 400), "request", False),
        (_error(FailureKind.UNSUPPORTED, 400), "unsupported", False),
    ],
)
def test_outcome_of_each_failure(error: AttemptError | None, outcome: str, failed: bool) -> None:
    assert outcome_of(error) == outcome
    assert (outcome in FAILED) is failed
    assert outcome in OUTCOMES


def test_every_failure_kind_has_an_outcome() -> None:
    for kind in FailureKind:
        assert outcome_of(_error(kind, 500)) in OUTCOMES


def test_counts_and_the_rolling_window() -> None:
    board = RegionAttempts(window_s=10.0)
    for outcome in ("server_error", "server_error", "timeout", "ok", "request"):
        board.add("a", outcome, 1.0)
    board.add("a", "spill", 2.0)
    board.add("b", "ok", 3.0)
    assert board.counts == {
        ("a", "server_error"): 2,
        ("a", "timeout"): 1,
        ("a", "ok"): 1,
        ("a", "request"): 1,
        ("a", "spill"): 1,
        ("b", "ok"): 1,
    }
    # Sent: five; failed by a: three; shed by the router: one, apart.
    a = board.totals("a", 5.0)
    assert a == AttemptTotals(attempts=5, errors=3, shed=1)
    assert a.error_rate == 0.6
    assert board.totals("b", 5.0) == AttemptTotals(1, 0, 0)
    assert board.totals("never", 5.0) == AttemptTotals(0, 0, 0)
    assert board.totals("never", 5.0).error_rate is None
    assert board.names() == ["a", "b"]
    # Out of the window, out of the status; the counters stay.
    assert board.totals("a", 30.0) == AttemptTotals(0, 0, 0)
    assert board.counts[("a", "server_error")] == 2


def test_a_region_shed_only_is_listed() -> None:
    board = RegionAttempts()
    board.add("c", "spill", 0.0)
    assert board.names() == ["c"]
    assert board.totals("c", 0.0) == AttemptTotals(0, 0, 1)


def _telemetry() -> Telemetry:
    return Telemetry(slo=SloTracker(SloTargets(window_s=60.0)), clock=lambda: 1.0)


def test_a_refused_request_counts_under_no_region() -> None:
    t = _telemetry()
    t.finish(AccessRecord(request_id="r", status=503, region="a", refused=True))
    t.finish(AccessRecord(request_id="s", status=502, region="a"))
    m = t.metrics
    assert m.server_errors == {"none": 1, "a": 1}
    assert {key[:2] for key in m.series} == {("none", "none"), ("a", "none")}
    assert t.slo.status("a", 1.0).errors == 1  # the 502 only
    assert t.slo.status("*", 1.0).errors == 2  # both failed their clients


def test_refused_is_a_503_after_a_spill() -> None:
    ctx = RequestContext("r", CHAT)
    assert not refused(ctx, 503)
    ctx.last_failure = FailureKind.SPILL
    assert refused(ctx, 503)
    # A spill, then another region answered.
    assert not refused(ctx, 200)
    ctx.last_failure = FailureKind.STATUS
    assert not refused(ctx, 503)  # a region's 503 passed on: that region's


def test_status_errors_are_the_regions_attempts() -> None:
    t = _telemetry()
    # a failed five attempts that b then served; c was full at the router five times.
    for _ in range(5):
        t.metrics.attempt("a", "server_error")
        t.metrics.attempt("b", "ok")
        t.finish(AccessRecord(request_id="r", status=200, region="b"))
        t.metrics.attempt("c", "spill")
        t.finish(AccessRecord(request_id="s", status=503, region="c", refused=True))
    regions = {r["name"]: r for r in feed(t, 1.0, 0.0)["regions"]}
    a, b, c = regions["a"], regions["b"], regions["c"]
    assert (a["requests"], a["attempts"], a["errors"], a["error_rate"]) == (0, 5, 5, 1.0)
    assert a["errors_ok"] is False
    assert (b["requests"], b["attempts"], b["errors"], b["error_rate"]) == (5, 5, 0, 0.0)
    assert b["errors_ok"] is True
    assert (c["requests"], c["attempts"], c["errors"], c["shed"]) == (0, 0, 0, 5)
    assert (c["error_rate"], c["errors_ok"]) == (None, True)


def _region(name: str) -> Upstream:
    async def never(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        raise AssertionError("no request is sent")

    config = RegionConfig(name=name, base_url="http://127.0.0.1:9/v1", models=("m",))
    return Upstream(config, LocalTransport(never), None)


def _ctx(stream: bool) -> RequestContext:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": %s}'
    ctx = RequestContext("r", CHAT)
    ctx.parsed = parse_body(CHAT, body % (b"true" if stream else b"false"))
    return ctx


def _first_byte(observer: Observer, ctx: RequestContext, region: Upstream) -> None:
    """A stream's first byte from `region`, as the attempt path tells it (Attempts.observe)."""
    ctx.streaming.append((region.name, ctx.request.upstream_model, 0.1))
    observer.attempt(ctx, region, None, 0.1)


def test_the_observer_counts_a_stream_once_it_ended_or_broke() -> None:
    t = _telemetry()
    observer = Observer(t, PassiveHealth(["a", "b"]))
    a, b = _region("a"), _region("b")
    # a fails, b answers a whole body.
    ctx = _ctx(stream=False)
    observer.attempt(ctx, a, _error(FailureKind.TIMEOUT), 1.0)
    observer.attempt(ctx, b, None, 0.1)
    observer.ended(ctx)
    assert t.metrics.attempts.counts == {}  # counted once the answer left (off its path)
    observer.count_attempts(ctx)
    assert t.metrics.attempts.counts == {("a", "timeout"): 1, ("b", "ok"): 1}
    observer.attempt(ctx, a, _error(FailureKind.CONNECT), 0.1)  # after it: at once
    assert t.metrics.attempts.counts[("a", "connect")] == 1
    # A stream from a breaks after its first byte, b continues it to its end.
    streams = OpenStreams(observer)
    ctx = _ctx(stream=True)
    _first_byte(observer, ctx, a)
    assert ("a", "ok") not in t.metrics.attempts.counts  # a first byte is no success yet
    streams.broke(ctx, "a")
    _first_byte(observer, ctx, b)
    streams.ended(ctx)
    streams.ended(ctx)  # a second end counts nothing twice
    observer.count_attempts(ctx)
    counts = t.metrics.attempts.counts
    assert (counts[("a", "broken")], counts[("b", "ok")]) == (1, 2)
    assert ("a", "ok") not in counts


def test_worker_status_feeds_merge_attempts() -> None:
    def region(attempts: int, errors: int, shed: int) -> dict[str, object]:
        return {"name": "a", "requests": 1, "attempts": attempts, "errors": errors, "shed": shed}

    def one(r: dict[str, object]) -> dict[str, object]:
        return {"ts": 1.0, "overall": {}, "cache": {}, "regions": [r]}

    merged = merge_status([one(region(4, 1, 2)), one(region(6, 4, 0))], workers=2)
    (a,) = merged["regions"]
    assert (a["requests"], a["attempts"], a["errors"], a["shed"]) == (2, 10, 5, 2)
    assert a["error_rate"] == 0.5
