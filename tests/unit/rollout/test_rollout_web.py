"""The rollout on the request path, without sockets: assign, region restriction, canary records."""

from __future__ import annotations

import msgspec
import pytest

from router.config import loads
from router.core.context import RequestContext
from router.core.failure import AttemptError, FailureKind
from router.core.request import CHAT, parse_body
from router.errors import InvalidRequest, NotFound
from router.rollout.runtime import RolloutRuntime, assignment, canary_hook, restrict

CONFIG = """
[[regions]]
name = "us"
base_url = "http://127.0.0.1:1"
models = ["llama-v1", "llama-v2"]

[[regions]]
name = "eu"
base_url = "http://127.0.0.1:2"
models = ["llama-v1", "llama-v2"]

[rollout.models.chat]
deployments = [
  { version = "v1", model = "llama-v1", weight = 50 },
  { version = "v2", model = "llama-v2", regions = ["eu"], weight = 50 },
]
"""


class FakeRegion:
    """Stands in for an Upstream: only its name is read when restricting candidates."""

    def __init__(self, name: str) -> None:
        self.name = name


def request(**fields: object) -> RequestContext:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **fields}
    ctx = RequestContext("r", CHAT)
    ctx.parsed = parse_body(CHAT, msgspec.json.encode(body))
    return ctx


def runtime() -> RolloutRuntime:
    return RolloutRuntime(loads(CONFIG))


def user_on(rt: RolloutRuntime, version: str) -> str:
    return next(
        u
        for u in (f"u{i}" for i in range(100))
        if rt.assign(request(user=u), {}).deployment.version == version
    )


def test_assign_rewrites_only_model_and_records_the_version() -> None:
    rt = runtime()
    ctx = request(user="alice", temperature=0.3, extra={"k": [1, None]})
    original = msgspec.json.decode(ctx.request.body)
    a = rt.assign(ctx, {})
    assert assignment(ctx) == a
    sent = msgspec.json.decode(ctx.request.body)
    assert sent.pop("model") == a.deployment.upstream_model
    original.pop("model")
    assert sent == original
    assert (
        ctx.request.model == "chat"
    )  # what the client asked for stays for auth, cache rules, logs


def test_assign_is_sticky_on_user_then_api_key() -> None:
    rt = runtime()
    v = {rt.assign(request(user="bob"), {}).deployment.version for _ in range(20)}
    assert len(v) == 1
    by_key = {
        rt.assign(request(), {"Authorization": "Bearer sk-123"}).deployment.version
        for _ in range(20)
    }
    assert len(by_key) == 1


def test_non_string_user_is_400() -> None:
    with pytest.raises(InvalidRequest) as err:
        runtime().assign(request(user=5), {})
    assert err.value.param == "user"


def test_unknown_model_is_404() -> None:
    ctx = RequestContext("r", CHAT)
    ctx.parsed = parse_body(CHAT, b'{"model":"nope","messages":[{"role":"user","content":"x"}]}')
    with pytest.raises(NotFound):
        runtime().assign(ctx, {})


def test_restrict_keeps_only_the_versions_regions() -> None:
    rt = runtime()
    regions = [FakeRegion("us"), FakeRegion("eu")]
    on_v2 = request(user=user_on(rt, "v2"))
    rt.assign(on_v2, {})
    assert [r.name for r in restrict(on_v2, regions)] == ["eu"]  # type: ignore[arg-type]
    on_v1 = request(user=user_on(rt, "v1"))
    rt.assign(on_v1, {})
    assert [r.name for r in restrict(on_v1, regions)] == ["us", "eu"]  # type: ignore[arg-type]


def test_no_region_left_counts_as_a_failure_of_the_version() -> None:
    rt = runtime()
    ctx = request(user=user_on(rt, "v2"))
    rt.assign(ctx, {})
    assert rt.regions(ctx, [FakeRegion("us")]) == []  # type: ignore[list-item]
    stats = rt.canary.tracker.stats("chat", "v2")
    assert (stats.samples, stats.errors) == (1, 1)


def test_canary_hook_records_attempts_and_ignores_429_and_spills() -> None:
    rt = runtime()
    hook = canary_hook(rt)
    ctx = request(user=user_on(rt, "v1"))
    rt.assign(ctx, {})
    region = FakeRegion("us")
    hook(ctx, region, None, 0.05)  # type: ignore[arg-type]
    hook(ctx, region, AttemptError("us", "status", "HTTP 503", status=503), 0.01)  # type: ignore[arg-type]
    hook(ctx, region, AttemptError("us", "status", "HTTP 429", status=429), 0.01)  # type: ignore[arg-type]
    hook(ctx, region, AttemptError("us", "timeout", "no first byte"), 1.0)  # type: ignore[arg-type]
    # The router's admission found the region full (no region saw it): not the version's fault.
    spill = AttemptError("us", FailureKind.SPILL, "full", status=503, retryable=True)
    hook(ctx, region, spill, 0.0)  # type: ignore[arg-type]
    stats = rt.canary.tracker.stats("chat", "v1")
    # A whole answer's time: judged against whole answers, not as a TTFT.
    assert (stats.samples, stats.errors, stats.whole_p95, stats.ttft_p95) == (3, 2, 0.05, None)
    unrouted = RequestContext("x", CHAT)
    hook(unrouted, region, None, 0.1)  # type: ignore[arg-type]
    assert rt.canary.tracker.stats("chat", "v1").samples == 3


def test_reload_swaps_table_and_policy() -> None:
    rt = runtime()
    text = CONFIG.replace('"llama-v1", weight = 50', '"llama-v1", weight = 0').replace(
        '["eu"], weight = 50', '["eu"], weight = 100'
    )
    new = loads(text + "\n[rollout.canary]\nauto_rollback = true\n")
    commit = rt.prepare_reload(loads(CONFIG), new)
    assert rt.rollout.table.alias("chat").weights() == {"v1": 50.0, "v2": 50.0}  # not yet
    commit()
    assert rt.rollout.table.alias("chat").weights() == {"v1": 0.0, "v2": 100.0}
    assert rt.canary.policy.auto_rollback
