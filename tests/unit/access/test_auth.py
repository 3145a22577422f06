"""API keys -> tenants: header parsing, hashes, 401/403 in OpenAI's shape, admin token, CLI."""

from __future__ import annotations

import hashlib
import io
import json
import logging

import pytest
from multidict import CIMultiDict

from router import config as config_mod
from router.access.auth import (
    ANONYMOUS_TENANT,
    Authenticator,
    Tenant,
    hash_key,
    presented_key,
    tenant_from_config,
)
from router.cli import main
from router.config import ApiKeyConfig, AuthConfig
from router.errors import ConfigError, Forbidden, Unauthorized

KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-9876543210"
ADMIN = "admin-secret-token-xyz"

REGION = """
[[regions]]
name = "r1"
base_url = "http://127.0.0.1:9"
models = ["m1", "m2"]
"""


def _auth(**overrides: object) -> AuthConfig:
    keys = (
        ApiKeyConfig(sha256=hash_key(KEY_A), tenant="a", models=("m1",), priority=5),
        ApiKeyConfig(sha256=hash_key(KEY_B), tenant="b", cache_namespace="shared"),
    )
    fields: dict[str, object] = {"keys": keys, "admin_token_sha256": hash_key(ADMIN)}
    fields.update(overrides)
    return AuthConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator.from_config(_auth())


def headers(**items: str) -> CIMultiDict[str]:
    return CIMultiDict((k.replace("_", "-"), v) for k, v in items.items())


def error_json(exc: Unauthorized | Forbidden) -> dict[str, object]:
    body: dict[str, dict[str, object]] = json.loads(exc.body())
    return body["error"]


def test_hash_key_is_sha256_hex() -> None:
    assert hash_key("sk-test") == hashlib.sha256(b"sk-test").hexdigest()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"Authorization": "Bearer sk-1"}, "sk-1"),
        ({"authorization": "bearer   sk-1  "}, "sk-1"),
        ({"x-api-key": "sk-2"}, "sk-2"),
        ({"X-Api-Key": " sk-2 "}, "sk-2"),
        ({"Authorization": "Basic abc"}, None),
        ({"Authorization": "Basic abc", "x-api-key": "sk-3"}, "sk-3"),
        ({"Authorization": "Bearer sk-1", "x-api-key": "sk-3"}, "sk-1"),
        ({"Authorization": "Bearer "}, None),
        ({"x-api-key": ""}, None),
        ({}, None),
    ],
)
def test_presented_key(given: dict[str, str], expected: str | None) -> None:
    assert presented_key(CIMultiDict(given)) == expected


def test_bearer_and_x_api_key_find_the_tenant(auth: Authenticator) -> None:
    a = auth.authenticate(headers(Authorization=f"Bearer {KEY_A}"))
    b = auth.authenticate(headers(x_api_key=KEY_B))
    assert (a.name, a.priority, a.cache_namespace) == ("a", 5, "a")
    assert (b.name, b.cache_namespace) == ("b", "shared")
    assert a.key_id == hash_key(KEY_A)[:16]


def test_missing_key_is_401_in_openai_shape(auth: Authenticator) -> None:
    with pytest.raises(Unauthorized) as caught:
        auth.authenticate(headers())
    assert caught.value.status == 401
    error = error_json(caught.value)
    assert error["type"] == "authentication_error"
    assert error["code"] == "missing_api_key"
    assert set(error) == {"message", "type", "param", "code"}


def test_wrong_key_is_401_and_never_echoed(auth: Authenticator) -> None:
    wrong = "sk-wrong-key-abcdefghij"
    with pytest.raises(Unauthorized) as caught:
        auth.authenticate(headers(Authorization=f"Bearer {wrong}"))
    error = error_json(caught.value)
    assert error["code"] == "invalid_api_key"
    assert wrong not in str(error["message"])
    assert "ghij" in str(error["message"])


@pytest.mark.parametrize("key", ["\udcff\udcfe-undecodable-bytes", "sk-\u00e9\u00e8-non-ascii-key"])
def test_odd_keys_are_401_not_a_crash(auth: Authenticator, key: str) -> None:
    with pytest.raises(Unauthorized) as caught:
        auth.authenticate(headers(Authorization=f"Bearer {key}"))
    assert b"***" in caught.value.body()


def test_model_not_allowed_is_403(auth: Authenticator) -> None:
    a = auth.authenticate(headers(Authorization=f"Bearer {KEY_A}"))
    auth.authorize_model(a, "m1")
    with pytest.raises(Forbidden) as caught:
        auth.authorize_model(a, "m2")
    assert caught.value.status == 403
    error = error_json(caught.value)
    assert (error["type"], error["code"], error["param"]) == (
        "permission_error",
        "model_not_allowed",
        "model",
    )


def test_key_without_model_list_may_use_any_model(auth: Authenticator) -> None:
    b = auth.authenticate(headers(x_api_key=KEY_B))
    auth.authorize_model(b, "anything")


def test_disabled_auth_serves_anonymous_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    auth = Authenticator.from_config(AuthConfig(enabled=False))
    with caplog.at_level(logging.WARNING, logger="router"):
        auth.warn_if_disabled()
    assert any("AUTH IS DISABLED" in r.message for r in caplog.records)
    assert auth.authenticate(headers()) is ANONYMOUS_TENANT
    assert auth.authenticate(headers(x_api_key="whatever")) is ANONYMOUS_TENANT
    assert ANONYMOUS_TENANT in auth.tenants


def test_enabled_auth_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="router"):
        Authenticator.from_config(_auth()).warn_if_disabled()
    assert not caplog.records


def test_duplicate_key_is_a_config_error() -> None:
    twice = ApiKeyConfig(sha256=hash_key(KEY_A), tenant="x")
    with pytest.raises(ConfigError, match="listed twice"):
        Authenticator.from_config(_auth(keys=(twice, twice)))


def test_admin_token_may_not_be_a_tenant_key() -> None:
    with pytest.raises(ConfigError, match="admin"):
        Authenticator.from_config(_auth(admin_token_sha256=hash_key(KEY_B)))


def test_admin_api_accepts_only_the_admin_token(auth: Authenticator) -> None:
    auth.check_admin(headers(Authorization=f"Bearer {ADMIN}"))
    with pytest.raises(Forbidden) as tenant_key:
        auth.check_admin(headers(Authorization=f"Bearer {KEY_A}"))
    assert tenant_key.value.code == "admin_only"
    with pytest.raises(Unauthorized):
        auth.check_admin(headers(Authorization="Bearer nope-nope-nope"))
    with pytest.raises(Unauthorized):
        auth.check_admin(headers())


def test_admin_token_is_not_a_tenant_key(auth: Authenticator) -> None:
    with pytest.raises(Unauthorized):
        auth.authenticate(headers(Authorization=f"Bearer {ADMIN}"))


def test_no_admin_token_configured_refuses_everyone() -> None:
    auth = Authenticator.from_config(_auth(admin_token_sha256=None))
    with pytest.raises(Unauthorized):
        auth.check_admin(headers(Authorization=f"Bearer {ADMIN}"))


def test_tenant_from_config_carries_every_field() -> None:
    key = ApiKeyConfig(
        sha256=hash_key("k"),
        tenant="t",
        models=("m1",),
        requests_per_minute=60,
        tokens_per_minute=1000,
        request_burst=5,
        token_burst=100,
        max_concurrent=3,
        priority=2,
    )
    assert tenant_from_config(key) == Tenant(
        key_id=hash_key("k")[:16],
        name="t",
        models=frozenset({"m1"}),
        requests_per_minute=60,
        tokens_per_minute=1000,
        request_burst=5,
        token_burst=100,
        max_concurrent=3,
        priority=2,
        cache_namespace="t",
    )


def test_config_decodes_auth_section() -> None:
    text = (
        REGION
        + f"""
[auth]
admin_token_sha256 = "{hash_key(ADMIN)}"
[[auth.keys]]
sha256 = "{hash_key(KEY_A)}"
tenant = "a"
models = ["m1"]
requests_per_minute = 60
"""
    )
    cfg = config_mod.loads(text, "router.toml")
    assert cfg.auth.keys[0].models == ("m1",)
    assert cfg.auth.keys[0].requests_per_minute == 60


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ('sha256 = "not-a-hash"\ntenant = "a"', "auth.keys[0].sha256"),
        (
            f'sha256 = "{hash_key("x")}"\ntenant = "a"\nrequests_per_minute = 0',
            "requests_per_minute",
        ),
        (f'sha256 = "{hash_key("x")}"\ntenant = "a"\nkey = "plaintext"', "key"),
    ],
)
def test_config_errors_name_file_and_field(entry: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_mod.loads(REGION + "[[auth.keys]]\n" + entry, "router.toml")
    assert "router.toml" in str(caught.value)
    assert field in str(caught.value)


def test_cli_hash_key_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "sk-test"]) == 0
    assert capsys.readouterr().out.strip() == hash_key("sk-test")


def test_cli_hash_key_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("sk-test\n"))
    assert main(["hash-key"]) == 0
    assert capsys.readouterr().out.strip() == hash_key("sk-test")


def test_cli_hash_key_refuses_empty(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert main(["hash-key"]) == 2
    assert "no key" in capsys.readouterr().err
