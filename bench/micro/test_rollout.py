"""Per-request cost of the rollout: version pick, full assign (user decode + rewrite), canary."""

from __future__ import annotations

import msgspec
from pytest_benchmark.fixture import BenchmarkFixture

from router.config import CanaryConfig, loads
from router.core.context import RequestContext
from router.core.request import CHAT, parse_body
from router.rollout.canary import CanaryMonitor
from router.rollout.runtime import RolloutRuntime
from router.rollout.table import Alias, Deployment, Rollout, RoutingTable

CONFIG = """
[[regions]]
name = "us"
base_url = "http://127.0.0.1:1"
models = ["llama-v1", "llama-v2"]

[rollout.models.chat-default]
deployments = [
  { version = "v1", model = "llama-v1", weight = 95 },
  { version = "v2", model = "llama-v2", weight = 5 },
]
"""

TABLE = RoutingTable.build(
    [
        Alias(
            "chat-default",
            (Deployment("v1", "llama-v1", weight=95.0), Deployment("v2", "llama-v2", weight=5.0)),
            stable="v1",
        )
    ]
)


def test_pick_sticky(benchmark: BenchmarkFixture) -> None:
    keys = [f"user-{i}" for i in range(1000)]

    def run() -> int:
        return sum(TABLE.pick("chat-default", user=k).version == "v2" for k in keys)

    canaries = benchmark(run)
    assert 20 <= canaries <= 90  # 5% of 1000, within 4 sigma (sigma ~6.9)


def test_assign_full_request(benchmark: BenchmarkFixture) -> None:
    runtime = RolloutRuntime(loads(CONFIG))
    body = msgspec.json.encode(
        {
            "model": "chat-default",
            "messages": [{"role": "user", "content": "hello " * 200}],
            "user": "user-42",
            "temperature": 0.2,
        }
    )
    parsed = parse_body(CHAT, body)
    headers = {"Authorization": "Bearer sk-test"}

    def run() -> str:
        ctx = RequestContext("r", CHAT)
        ctx.parsed = parsed
        runtime.assign(ctx, headers)
        return ctx.request.upstream_model

    upstream = benchmark(run)
    assert (
        upstream
        == {"v1": "llama-v1", "v2": "llama-v2"}[TABLE.pick("chat-default", user="user-42").version]
    )


def test_canary_record(benchmark: BenchmarkFixture) -> None:
    monitor = CanaryMonitor(Rollout(TABLE), CanaryConfig(auto_rollback=True, check_interval_s=1.0))

    def run() -> None:
        monitor.record("chat-default", "v2", ok=True, ttft_s=0.05)

    benchmark(run)
    assert monitor.tracker.stats("chat-default", "v2").samples > 0
