"""The core's sub-commands as a user runs them: check-config, --help, --version."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO, free_port, router_cmd


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(router_cmd(*args), capture_output=True, text=True, timeout=30, cwd=REPO)


def test_check_config_accepts_the_sample() -> None:
    out = run("check-config", "examples/router.toml")
    assert out.returncode == 0, out.stderr
    assert "ok (2 regions: eu-west, us-east" in out.stdout


def test_check_config_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[regions]]\nname = "a"\nbase_url = "http://x"\nmodels = ["m"]\nweight = "x"\n')
    out = run("check-config", str(bad))
    assert out.returncode == 2
    assert f"{bad}: field `regions[0].weight`: Expected `float`, got `str`" in out.stderr


def test_help_lists_the_core_commands_and_version_works() -> None:
    helped = run("--help")
    assert helped.returncode == 0
    for command in ("serve", "check-config", "sim-region", "demo"):
        assert command in helped.stdout
    assert run("--version").stdout.startswith("router ")


def test_sim_region_rejects_an_unknown_fail_mode() -> None:
    out = run("sim-region", "--port", "1", "--fail-mode", "explode")
    assert out.returncode == 2
    assert "--fail-mode must be one of" in out.stderr


def test_keygen_prints_a_key_and_its_hash() -> None:
    out = run("keygen")
    assert out.returncode == 0, out.stderr
    fields = dict(line.split(":", 1) for line in out.stdout.splitlines() if ": " in line[:8])
    key, digest = fields["key"].strip(), fields["sha256"].strip()
    assert key.startswith("sk-router-")
    assert len(key) > 40
    assert run("hash-key", key).stdout.strip() == digest
    assert run("keygen").stdout != out.stdout


_REGION = '[[regions]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodels = ["m"]\n'
_KEY = "a" * 64
# Values the schema lets through that a component refuses: each, and the words that name it.
_REFUSED = {
    "circuit": ("[routing]\ncircuit_base_s = 10.0\ncircuit_max_s = 5.0\n", "circuit_base_s"),
    "ejection": ("[health]\nbase_ejection_s = 90.0\nmax_ejection_s = 60.0\n", "base_ejection"),
    "probe path": ('[health]\npath = "/he alth"\n', "probe path"),
    "admin token": (
        f'[auth]\nadmin_token_sha256 = "{_KEY}"\n[[auth.keys]]\nsha256 = "{_KEY}"\ntenant = "t"\n',
        "admin token must not be a tenant key",
    ),
    "key twice": (
        f'[[auth.keys]]\nsha256 = "{_KEY}"\ntenant = "t"\n'
        f'[[auth.keys]]\nsha256 = "{_KEY}"\ntenant = "u"\n',
        "listed twice",
    ),
    # Beyond Duration's range: the native prober panicked on the first failed request.
    "huge ejection": (
        "[health]\neject_after = 1\nbase_ejection_s = 1e19\nmax_ejection_s = 1e19\n",
        "health.base_ejection_s",
    ),
    "huge timeout": ("[health]\ntimeout_s = 1e19\n", "health.timeout_s"),
    "inf timeout": ("[health]\ntimeout_s = inf\n", "health.timeout_s"),
    # Redis URLs `serve` died on with a traceback.
    "limits redis scheme": (
        '[limits]\nbackend = "redis"\nredis_url = "http://127.0.0.1:6379/0"\n',
        "limits.redis_url",
    ),
    "limits redis port": (
        '[limits]\nbackend = "redis"\nredis_url = "redis://:hunter2@127.0.0.1:notaport/0"\n',
        "limits.redis_url",
    ),
    "cache redis port": (
        '[cache]\nredis_url = "redis://:hunter2@127.0.0.1:99999/0"\n',
        "cache.redis_url",
    ),
    "state redis host": ('[state]\nredis_url = "redis://:hunter2@:6379/0"\n', "state.redis_url"),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_check_config_refuses_what_serve_refuses_and_serve_exits_2(
    tmp_path: Path, case: str
) -> None:
    text, named = _REFUSED[case]
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[server]\nlisten = "127.0.0.1:{free_port()}"\n{_REGION}{text}')
    for args in (("check-config", str(bad)), ("serve", "--config", str(bad))):
        out = run(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert named in out.stderr
        assert str(bad) in out.stderr
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "hunter2" not in out.stderr


@pytest.mark.parametrize("workers", ["\u00b2", "\u0663", "0", "65"])
def test_workers_flag_and_variable_take_ascii_digits_only(tmp_path: Path, workers: str) -> None:
    config = tmp_path / "r.toml"
    config.write_text(f'[server]\nlisten = "127.0.0.1:{free_port()}"\n{_REGION}')
    out = run("serve", "--config", str(config), "--workers", workers)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f'--workers must be 1 to 64 or "auto", got {workers!r}' in out.stderr
    if workers.isdigit() and not workers.isascii():
        env = {**os.environ, "ROUTER_SERVER_WORKERS": workers}
        checked = subprocess.run(
            router_cmd("check-config", str(config)),
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
            env=env,
        )
        assert checked.returncode == 2, checked.stderr
        assert "ROUTER_SERVER_WORKERS" in checked.stderr
        assert "invalid literal" not in checked.stderr


def test_check_config_loads_the_tls_files_as_serve_does(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    config = tmp_path / "r.toml"
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{free_port()}"\n'
        f'[server.tls]\ncert_file = "{missing}"\nkey_file = "{missing}"\n{_REGION}'
    )
    out = run("check-config", str(config))
    assert out.returncode == 2, out.stdout
    assert out.stderr.strip() == (
        f"router: {config}: field `server.tls`: cannot read {missing}: no such file or directory"
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    config.write_text(config.read_text().replace(str(missing), str(garbage)))
    out = run("check-config", str(config))
    assert out.returncode == 2, out.stdout
    assert "not a PEM certificate chain" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
