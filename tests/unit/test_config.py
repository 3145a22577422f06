"""Config decoding: defaults, the sample file, and errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from router.config import Config, load, loads, parse_listen
from router.errors import ConfigError
from tests.support import REPO

REGION = """
[[regions]]
name = "a"
base_url = "http://127.0.0.1:9000/v1"
models = ["m1"]
"""


def test_minimal_config_gets_defaults() -> None:
    config = loads(REGION, "min.toml")
    assert config.server.listen == "127.0.0.1:8080"
    assert config.server.max_body_bytes == 1 << 20
    assert config.timeouts.connect > 0
    assert config.regions[0].api_key_env is None
    assert config.regions[0].weight == 1.0
    assert config.served_models() == ("m1",)


def test_sample_config_loads() -> None:
    config = load(REPO / "examples" / "router.toml")
    assert [r.name for r in config.regions] == ["eu-west", "us-east"]
    assert config.models.aliases == {"gpt-4o-mini": "llama-3.1-8b"}
    assert "gpt-4o-mini" in config.served_models()


def test_every_section_is_present_and_frozen() -> None:
    config = loads(REGION)
    for name in (
        "server",
        "timeouts",
        "models",
        "auth",
        "limits",
        "cache",
        "health",
        "routing",
        "observability",
        "rollout",
    ):
        assert isinstance(getattr(config, name), msgspec.Struct)
    with pytest.raises(AttributeError):
        config.server.listen = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        ("", "regions", "missing required field"),
        ("regions = []", "regions", "at least one"),
        (REGION + '[server]\nmax_body_bytes = "big"\n', "server.max_body_bytes", "Expected `int`"),
        (REGION + '[server]\nlisten = "nope"\n', "server.listen", "host:port"),
        (REGION + "[server]\nmax_body_bytes = 0\n", "server.max_body_bytes", "positive"),
        (REGION + "[timeouts]\nidle = -1\n", "timeouts.idle", "positive"),
        (REGION + '[timeouts]\nidle = "x"\n', "timeouts.idle", "Expected `float`"),
        (
            REGION.replace('models = ["m1"]', 'models = ["m1"]\ncolour = 1'),
            "regions[0]",
            "unknown field `colour`",
        ),
        (REGION.replace('"a"', "7"), "regions[0].name", "Expected `str`"),
        (REGION + REGION, "regions[1].name", "unique"),
        (REGION.replace("http://", "ftp://"), "regions[0].base_url", "http(s) URL"),
        (REGION.replace('["m1"]', "[]"), "regions[0].models", "at least one model"),
        (REGION + '[models]\naliases = { "x" = "m9" }\n', "models.aliases.x", "some region"),
        (
            REGION + "[admission]\nregion_max_in_flight = { b = 2 }\n",
            "admission.region_max_in_flight.b",
            "a region's name (a)",
        ),
        # The prober's times are bounded (beyond Duration's range the native prober panicked).
        (REGION + "[health]\ntimeout_s = 1e19\n", "health.timeout_s", "<= 86400"),
        (REGION + "[health]\ntimeout_s = inf\n", "health.timeout_s", "<= 86400"),
        (REGION + "[health]\ninterval_s = 1.7e19\n", "health.interval_s", "<= 86400"),
        (
            REGION + "[health]\neject_after = 1\nbase_ejection_s = 1e19\nmax_ejection_s = 1e19\n",
            "health.base_ejection_s",
            "<= 86400",
        ),
        (REGION + "[health]\nmax_ejection_s = 1e19\n", "health.max_ejection_s", "<= 86400"),
        # Every Redis URL, checked at load (serve used to die on it with a traceback).
        (
            REGION + '[limits]\nbackend = "redis"\nredis_url = "http://127.0.0.1:6379/0"\n',
            "limits.redis_url",
            "got scheme 'http'",
        ),
        (
            REGION + '[limits]\nredis_url = "redis://:pw@127.0.0.1:notaport/0"\n',
            "limits.redis_url",
            "port from 1 to 65535",
        ),
        (
            REGION + '[cache]\nredis_url = "redis://:pw@127.0.0.1:99999/0"\n',
            "cache.redis_url",
            "port from 1 to 65535",
        ),
        (REGION + '[state]\nredis_url = "unix://"\n', "state.redis_url", "socket path"),
        # Names that go out in response headers: a control character broke every answer.
        (REGION.replace('name = "a"', r'name = "a\nb"'), "regions[0].name", "control characters"),
        (REGION.replace('"m1"', r'"m\u0007"'), "regions[0].models", "control characters"),
        (REGION + '[models]\naliases = { "x\\ty" = "m1" }\n', "models.aliases", "control"),
        (
            REGION + '[rollout.models.chat]\ndeployments = [{version = "v\\r1", model = "m1"}]\n',
            "rollout.models.chat.deployments[0].version",
            "control characters",
        ),
        (
            REGION + '[rollout.models.chat]\ndeployments = [{model = "m1", version = "v1", '
            "weight = 1e308}]\n",
            "rollout.models[...].deployments[0].weight",
            "<= 1000000000.0",
        ),
    ],
)
def test_errors_name_file_field_and_expectation(text: str, field: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads(text, "conf/r.toml")
    message = str(info.value)
    assert message.startswith("conf/r.toml: ")
    if field != "regions" or "missing" not in expected:
        assert f"`{field}`" in message
    assert expected in message


def test_redis_url_errors_never_show_the_password() -> None:
    for url in ("redis://:hunter2@127.0.0.1:notaport/0", "http://u:hunter2@h:6379/0"):
        with pytest.raises(ConfigError) as info:
            loads(REGION + f'[limits]\nredis_url = "{url}"\n')
        assert "hunter2" not in str(info.value)
        assert "\n" not in str(info.value)


def test_unknown_section_is_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown field `bogus`"):
        loads(REGION + "[bogus]\nx = 1\n", "f.toml")


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server\nlisten = 1")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML"):
        load(path)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nothere\.toml: cannot read"):
        load(tmp_path / "nothere.toml")


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:80") == ("::1", 80)
    for bad in ("8080", ":80", "host:", "host:99999", "host:x"):
        with pytest.raises(ValueError, match="host:port"):
            parse_listen(bad)


def test_config_is_a_plain_struct_for_other_features() -> None:
    config = loads(REGION)
    assert isinstance(config, Config)
    assert msgspec.convert(msgspec.to_builtins(config), Config) == config


def test_region_endpoints_default_by_kind_and_show_per_model() -> None:
    from router.config import Config, RegionConfig

    def region(name: str, kind: str, models: tuple[str, ...], **extra: object) -> RegionConfig:
        return RegionConfig(name=name, base_url="http://h/v1", models=models, kind=kind, **extra)  # type: ignore[arg-type]

    assert region("a", "generic", ("m",)).served_endpoints() == (
        "chat",
        "completions",
        "embeddings",
    )
    assert region("a", "llama-cpp-python", ("m",)).served_endpoints() == (
        "chat",
        "completions",
        "embeddings",
    )
    assert region("a", "openai", ("m",)).served_endpoints()[-2:] == ("responses", "input_tokens")
    assert "messages" in region("a", "llama-server", ("m",)).served_endpoints()
    custom = region("b", "vllm", ("n",), endpoints=("messages",))
    config = Config(regions=(region("a", "generic", ("m",)), custom))
    assert config.endpoints_of("m") == ("chat", "completions", "embeddings")
    assert config.endpoints_of("n") == ("messages",)
    assert config.endpoints_of("unknown") == ()
