"""Rollout: weights honoured, sticky assignment, minimal movement, atomic swaps, body rewrite."""

from __future__ import annotations

import math
from collections import Counter

import msgspec
import pytest

from router.config import loads
from router.errors import ConfigError, InvalidRequest, NotFound
from router.rollout.table import (
    Alias,
    Deployment,
    Rollout,
    RoutingTable,
    assign,
    describe,
    table_from_config,
    unit_of,
)

N = 10_000
KEYS = [f"user-{i}" for i in range(N)]


def alias(*weights: float, sticky: str = "user", name: str = "chat-default") -> Alias:
    deployments = tuple(
        Deployment(version=f"v{i + 1}", upstream_model=f"model-v{i + 1}", weight=w)
        for i, w in enumerate(weights)
    )
    return Alias(name=name, deployments=deployments, stable="v1", sticky=sticky)


def four_sigma(n: int, p: float) -> float:
    return 4 * math.sqrt(n * p * (1 - p))


def counts(a: Alias) -> Counter[str]:
    return Counter(assign(a, k).version for k in KEYS)


@pytest.mark.parametrize(
    "weights", [(95.0, 5.0), (99.0, 1.0), (50.0, 50.0), (70.0, 20.0, 10.0), (1.0, 3.0)]
)
def test_weights_honoured_within_four_sigma_over_10k_keys(weights: tuple[float, ...]) -> None:
    c = counts(alias(*weights))
    total = sum(weights)
    for i, w in enumerate(weights):
        p = w / total
        assert abs(c[f"v{i + 1}"] - N * p) <= four_sigma(N, p), (c, weights)


def test_random_pick_without_key_honours_weights() -> None:
    table = RoutingTable.build([alias(90.0, 10.0, sticky="none")])
    rand = iter(i / N for i in range(N))
    c = Counter(table.pick("chat-default", rand=lambda: next(rand)).version for _ in range(N))
    assert c["v2"] == pytest.approx(N * 0.10, abs=1)


def test_zero_weight_version_gets_no_traffic() -> None:
    assert counts(alias(100.0, 0.0))["v2"] == 0


def test_same_key_same_version_across_calls_and_tables() -> None:
    table = RoutingTable.build([alias(80.0, 20.0)])
    first = {k: table.pick("chat-default", user=k).version for k in KEYS[:1000]}
    assert set(first.values()) == {"v1", "v2"}
    assert all(table.pick("chat-default", user=k).version == v for k, v in first.items())
    rebuilt = RoutingTable.build([alias(80.0, 20.0)])
    assert all(rebuilt.pick("chat-default", user=k).version == v for k, v in first.items())


def test_weight_change_moves_only_the_minimum_share() -> None:
    before = {k: assign(alias(95.0, 5.0), k).version for k in KEYS}
    after = {k: assign(alias(90.0, 10.0), k).version for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    # growing v2 only ever pulls keys into v2: nobody on v2 leaves it
    assert all(before[k] == "v1" and after[k] == "v2" for k in moved)
    assert abs(len(moved) - N * 0.05) <= four_sigma(N, 0.05)


def test_changing_one_of_three_weights_only_moves_keys_to_or_from_it() -> None:
    before = {k: assign(alias(60.0, 30.0, 10.0), k).version for k in KEYS}
    after = {k: assign(alias(60.0, 30.0, 0.0), k).version for k in KEYS}
    for k in KEYS:
        if before[k] != "v3":
            assert after[k] == before[k]
        else:
            assert after[k] in ("v1", "v2")


def test_keys_are_independent_per_alias() -> None:
    a = alias(50.0, 50.0, name="a")
    b = alias(50.0, 50.0, name="b")
    same = sum(assign(a, k).version == assign(b, k).version for k in KEYS)
    assert abs(same - N / 2) <= four_sigma(N, 0.5)


def test_sticky_key_prefers_user_then_api_key() -> None:
    table = RoutingTable.build([alias(50.0, 50.0)])
    by_user = {table.pick("chat-default", user=k, api_key="shared").version for k in KEYS[:200]}
    assert by_user == {"v1", "v2"}
    by_key = {table.pick("chat-default", api_key="sk-1").version for _ in range(50)}
    assert len(by_key) == 1


def test_api_key_stickiness_ignores_user() -> None:
    table = RoutingTable.build([alias(50.0, 50.0, sticky="api_key")])
    picks = {table.pick("chat-default", user=k, api_key="sk-1").version for k in KEYS[:200]}
    assert len(picks) == 1


def test_unknown_alias_is_404_in_openai_shape() -> None:
    table = RoutingTable.build([alias(100.0)])
    with pytest.raises(NotFound) as err:
        table.pick("gpt-nope", user="u")
    body = msgspec.json.decode(err.value.body())
    assert err.value.status == 404
    assert body["error"]["code"] == "model_not_found"
    assert body["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("a", "message"),
    [
        (Alias(name="m", deployments=(), stable="v1"), "no deployments"),
        (
            alias(100.0, 0.0).__class__(
                name="m", deployments=alias(1.0).deployments * 2, stable="v1"
            ),
            "duplicate version",
        ),
        (Alias(name="m", deployments=alias(1.0).deployments, stable="v9"), "stable version 'v9'"),
        (alias(0.0, 0.0), "all weights are zero"),
        (alias(-1.0, 2.0), "weight must be"),
        (alias(float("nan"), 2.0), "weight must be"),
        # Past this a score or the sum overflows and infinities tie: the split would be wrong.
        (alias(1e308, 1e308), "weight must be"),
        (alias(2e9, 1.0), "weight must be"),
        (alias(1.0, sticky="ip"), "sticky must be"),
        (
            Alias(name="m", deployments=(Deployment("v1", "", weight=1.0),), stable="v1"),
            "empty upstream_model",
        ),
    ],
)
def test_invalid_aliases_rejected_with_reason(a: Alias, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RoutingTable.build([a])


def test_alias_defined_twice_rejected() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        RoutingTable.build([alias(1.0), alias(1.0)])


def test_with_weights_returns_new_table_and_leaves_old_untouched() -> None:
    old = RoutingTable.build([alias(95.0, 5.0)])
    new = old.with_weights("chat-default", {"v2": 50.0})
    assert old.alias("chat-default").weights() == {"v1": 95.0, "v2": 5.0}
    assert new.alias("chat-default").weights() == {"v1": 95.0, "v2": 50.0}
    assert new.generation == old.generation + 1


def test_with_weights_rejects_unknown_version_and_all_zero() -> None:
    table = RoutingTable.build([alias(95.0, 5.0)])
    with pytest.raises(InvalidRequest, match="no version 'v7'"):
        table.with_weights("chat-default", {"v7": 1.0})
    with pytest.raises(InvalidRequest, match="all weights are zero"):
        table.with_weights("chat-default", {"v1": 0.0, "v2": 0.0})
    with pytest.raises(InvalidRequest, match="weight must be"):
        table.with_weights("chat-default", {"v1": -3.0})


def test_rollback_sends_everyone_to_stable_and_keeps_canary_deployed() -> None:
    rollout = Rollout(RoutingTable.build([alias(95.0, 5.0)]))
    in_flight = rollout.table
    rollout.rollback("chat-default")
    assert counts(rollout.table.alias("chat-default")) == Counter({"v1": N})
    assert rollout.table.alias("chat-default").deployment("v2").upstream_model == "model-v2"
    # a request that read the table before the swap still routes by it
    assert counts(in_flight.alias("chat-default"))["v2"] > 0
    rollout.rollback("chat-default", to="v2")
    assert counts(rollout.table.alias("chat-default")) == Counter({"v2": N})


def test_rollback_to_unknown_version_is_404() -> None:
    rollout = Rollout(RoutingTable.build([alias(95.0, 5.0)]))
    with pytest.raises(NotFound, match="no version 'v3'") as caught:
        rollout.rollback("chat-default", to="v3")
    assert caught.value.param == "to"


def test_rolling_forward_after_a_rollback_gives_the_canary_its_share() -> None:
    rollout = Rollout(RoutingTable.build([alias(80.0, 20.0)]))
    rollout.rollback("chat-default")
    assert rollout.table.alias("chat-default").weights() == {"v1": 80.0, "v2": 0.0}
    rollout.set_weights("chat-default", {"v2": 20.0})
    got = counts(rollout.table.alias("chat-default"))
    assert 0.15 * N < got["v2"] < 0.25 * N, got
    # A target at weight 0 gets what all the versions had.
    rollout.set_weights("chat-default", {"v1": 0.0})
    rollout.rollback("chat-default")
    assert rollout.table.alias("chat-default").weights() == {"v1": 20.0, "v2": 0.0}


def test_replace_bumps_generation_past_current() -> None:
    rollout = Rollout(RoutingTable.build([alias(95.0, 5.0)]))
    rollout.set_weights("chat-default", {"v2": 10.0})
    rollout.set_weights("chat-default", {"v2": 20.0})
    before = rollout.table.generation
    rollout.replace(RoutingTable.build([alias(1.0)]))
    assert rollout.table.generation == before + 1
    assert rollout.table.alias("chat-default").weights() == {"v1": 1.0}


def test_describe_lists_every_deployment() -> None:
    table = RoutingTable.build(
        [Alias("m", (Deployment("v1", "up-1", ("us", "eu"), 3.0),), stable="v1")]
    )
    assert describe(table) == {
        "generation": 0,
        "models": {
            "m": {
                "stable": "v1",
                "sticky": "user",
                "deployments": [
                    {
                        "version": "v1",
                        "upstream_model": "up-1",
                        "regions": ["us", "eu"],
                        "weight": 3.0,
                    }
                ],
            }
        },
    }


CONFIG = """
[[regions]]
name = "us"
base_url = "http://127.0.0.1:1"
models = ["llama-v1", "llama-v2"]

[[regions]]
name = "eu"
base_url = "http://127.0.0.1:2"
models = ["llama-v1"]

[models]
aliases = { fast = "llama-v1" }

[rollout.canary]
auto_rollback = true
min_samples = 10

[rollout.models.chat-default]
stable = "v1"
sticky = "api_key"
deployments = [
  { version = "v1", model = "llama-v1", weight = 95 },
  { version = "v2", model = "llama-v2", regions = ["us"], weight = 5 },
]
"""


def test_table_from_config_covers_versions_aliases_and_region_models() -> None:
    config = loads(CONFIG, "router.toml")
    table = table_from_config(config)
    chat = table.alias("chat-default")
    assert chat.weights() == {"v1": 95.0, "v2": 5.0}
    assert chat.deployment("v2") == Deployment("v2", "llama-v2", ("us",), 5.0)
    assert (chat.stable, chat.sticky) == ("v1", "api_key")
    assert table.pick("fast").upstream_model == "llama-v1"
    assert table.pick("fast").version == "llama-v1"
    assert table.pick("llama-v2").upstream_model == "llama-v2"
    assert set(table.aliases) == {"chat-default", "fast", "llama-v1", "llama-v2"}
    assert "chat-default" in config.served_models()
    assert config.rollout.canary.min_samples == 10


def test_stable_defaults_to_first_deployment() -> None:
    text = CONFIG.replace('stable = "v1"\n', "")
    assert table_from_config(loads(text)).alias("chat-default").stable == "v1"


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (
            'model = "llama-v2"',
            'model = "nope"',
            "rollout.models.chat-default.deployments[1].model",
        ),
        (
            'regions = ["us"]',
            'regions = ["eu"]',
            "rollout.models.chat-default.deployments[1].regions",
        ),
        (
            '{ version = "v2"',
            '{ version = "v1"',
            "rollout.models.chat-default.deployments[1].version",
        ),
        ('stable = "v1"', 'stable = "v3"', "rollout.models.chat-default.stable"),
        ("weight = 5 ", "weight = -5 ", "rollout.models[...].deployments[1].weight"),
        ('sticky = "api_key"', 'sticky = "ip"', "rollout.models[...].sticky"),
        ("min_samples = 10", "min_samples = 0", "rollout.canary.min_samples"),
        ("min_samples = 10", "min_sample = 10", "rollout.canary"),
        ("fast = ", '"chat-default" = ', "rollout.models.chat-default"),
    ],
)
def test_bad_rollout_config_names_file_and_field(old: str, new: str, field: str) -> None:
    assert old in CONFIG
    with pytest.raises(ConfigError) as err:
        loads(CONFIG.replace(old, new), "router.toml")
    assert str(err.value).startswith(f"router.toml: field `{field}`"), str(err.value)


def test_all_zero_weights_rejected() -> None:
    text = CONFIG.replace("weight = 95", "weight = 0").replace("weight = 5 ", "weight = 0 ")
    with pytest.raises(ConfigError, match="deployments`: expected at least one positive weight"):
        loads(text, "router.toml")


def test_hash_to_unit_stays_strictly_inside_zero_one() -> None:
    for h in (0, 1, 2**63, 2**64 - 2**11, 2**64 - 1):
        u = unit_of(h)
        assert 0.0 < u < 1.0
        assert -math.log(u) > 0


def test_a_rollback_to_a_version_at_weight_0_fits_the_weight_bound() -> None:
    rollout = Rollout(RoutingTable.build([alias(0.0, 1e9, 1e9)]))
    rollout.rollback("chat-default")
    assert rollout.table.alias("chat-default").weights() == {"v1": 1e9, "v2": 0.0, "v3": 0.0}
