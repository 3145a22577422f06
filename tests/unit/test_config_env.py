"""Per-host environment overrides, "did you mean" for misspelled fields, the raw-key hint."""

from __future__ import annotations

import pytest

from router.config import loads
from router.config_env import OVERRIDABLE, env_name
from router.errors import ConfigError

REGION = '[[regions]]\nname = "a"\nbase_url = "http://127.0.0.1:9000/v1"\nmodels = ["m1"]\n'


def test_naming_rule() -> None:
    assert env_name("server", "listen") == "ROUTER_SERVER_LISTEN"
    assert env_name("server", "tls", "cert_file") == "ROUTER_SERVER_TLS_CERT_FILE"
    assert env_name("limits", "redis_url") == "ROUTER_LIMITS_REDIS_URL"
    assert len({env_name(*path) for path in OVERRIDABLE}) == len(OVERRIDABLE)


@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "8\u00b2"])
def test_workers_must_be_ascii_digits_and_the_error_names_the_variable(value: str) -> None:
    # str.isdigit() takes "²" and "٣"; int() refuses "²": no "invalid literal" without a name.
    with pytest.raises(ConfigError) as info:
        loads(REGION, "r.toml", {"ROUTER_SERVER_WORKERS": value})
    message = str(info.value)
    assert "ROUTER_SERVER_WORKERS" in message
    assert "`server.workers`" in message
    assert "invalid literal" not in message


def test_environment_overrides_the_file() -> None:
    text = (
        '[server]\nlisten = "127.0.0.1:8080"\n[limits]\nredis_url = "redis://file:6379"\n' + REGION
    )
    env = {
        "ROUTER_SERVER_LISTEN": "0.0.0.0:9443",
        "ROUTER_SERVER_ADMIN_LISTEN": "10.0.0.1:9090",
        "ROUTER_LIMITS_REDIS_URL": "redis://:pw@redis.internal:6379/1",
        "ROUTER_CACHE_REDIS_URL": "rediss://cache.internal:6380",
        "ROUTER_STATE_REDIS_URL": "redis://:pw@state.internal:6379/2",
        "ROUTER_SERVER_TLS_CERT_FILE": "/etc/router/cert.pem",
        "ROUTER_SERVER_TLS_KEY_FILE": "/etc/router/key.pem",
        "UNRELATED": "x",
    }
    config = loads(text, "r.toml", env)
    assert config.server.listen == "0.0.0.0:9443"
    assert config.server.admin_listen == "10.0.0.1:9090"
    assert config.limits.redis_url == "redis://:pw@redis.internal:6379/1"
    assert config.cache.redis_url == "rediss://cache.internal:6380"
    assert config.state.redis_url == "redis://:pw@state.internal:6379/2"
    assert config.server.tls is not None
    assert config.server.tls.key_file == "/etc/router/key.pem"
    # Without env, the file alone.
    assert loads(text, "r.toml").server.listen == "127.0.0.1:8080"


def test_a_bad_override_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"r\.toml \(with ROUTER_SERVER_LISTEN\): field `server"):
        loads(REGION, "r.toml", {"ROUTER_SERVER_LISTEN": "nowhere"})
    with pytest.raises(ConfigError, match="ROUTER_LIMITS_REDIS_URL is set but empty"):
        loads(REGION, "r.toml", {"ROUTER_LIMITS_REDIS_URL": ""})


@pytest.mark.parametrize(
    ("text", "suggestion"),
    [
        ('[server]\nlisen = "127.0.0.1:1"\n', "did you mean `listen`?"),
        ("[server]\nmax_body_byte = 10\n", "did you mean `max_body_bytes`?"),
        ("[healht]\nenabled = true\n", "did you mean `health`?"),
        (
            '[[regions]]\nname = "b"\nbase_url = "http://x/v1"\nmodels = ["m"]\nwieght = 2\n',
            "did you mean `weight`?",
        ),
        ("[cache.models.m1]\nttl = 5\n", "did you mean `ttl_s`?"),
    ],
)
def test_did_you_mean(text: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as caught:
        loads(REGION + text, "r.toml")
    assert suggestion in str(caught.value)


def test_no_suggestion_for_nonsense() -> None:
    with pytest.raises(ConfigError) as caught:
        loads(REGION + "[server]\nzzzzqqq = 1\n", "r.toml")
    assert "did you mean" not in str(caught.value)


def test_a_raw_key_in_sha256_points_to_hash_key() -> None:
    text = REGION + '[[auth.keys]]\nsha256 = "sk-my-raw-key"\ntenant = "t"\n'
    with pytest.raises(ConfigError) as caught:
        loads(text, "r.toml")
    message = str(caught.value)
    assert "field `auth.keys[0].sha256`" in message
    assert "router hash-key" in message
    with pytest.raises(ConfigError, match="router hash-key"):
        loads(REGION + '[auth]\nadmin_token_sha256 = "admin-secret"\n', "r.toml")
