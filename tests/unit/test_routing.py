"""Routing policy pieces: client deadline, retry gate, first-byte timeout, health outcomes."""

from __future__ import annotations

import time

import pytest

from router.budget import RetryBudget
from router.config import RoutingConfig
from router.context import RequestContext
from router.health import outcome_of
from router.routing import DEADLINE, client_deadline, first_byte, retry_gate


def test_client_deadline_from_headers() -> None:
    assert client_deadline({}, 100.0) is None
    assert client_deadline({"x-stainless-timeout": "600"}, 100.0) == 700.0
    assert client_deadline({"x-router-timeout-ms": "250"}, 100.0) == pytest.approx(100.25)
    for bad in ("abc", "-1", "0", "nan", "inf"):
        assert client_deadline({"x-stainless-timeout": bad}, 1.0) is None


def test_retry_gate_caps_attempts_budget_and_deadline() -> None:
    gate = retry_gate(RetryBudget(ratio=0.0, min_retries=2), RoutingConfig(max_attempts=3))
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
    other.extra[DEADLINE] = time.monotonic() - 1.0
    roomy = retry_gate(RetryBudget(min_retries=10), RoutingConfig())
    assert not roomy(other)


def test_first_byte_timeout_uses_routing_then_deadline() -> None:
    ctx = RequestContext("r", "/v1/chat/completions")
    assert first_byte(RoutingConfig())(ctx, 30.0) == 30.0
    assert first_byte(RoutingConfig(ttft_timeout_s=2.0))(ctx, 30.0) == 2.0
    ctx.extra[DEADLINE] = time.monotonic() + 0.5
    assert 0.0 < first_byte(RoutingConfig(ttft_timeout_s=2.0))(ctx, 30.0) <= 0.5
    ctx.extra[DEADLINE] = time.monotonic() - 5
    assert first_byte(RoutingConfig())(ctx, 30.0) == 0.001


def test_outcomes_for_health() -> None:
    assert outcome_of(None, None) == "ok"
    assert outcome_of("connect", None) == "connect_error"
    assert outcome_of("timeout", None) == "timeout"
    assert outcome_of("status", 503) == "server_error"
    assert outcome_of("status", 429) == "neutral"
    assert outcome_of("disconnect", None) == "server_error"
