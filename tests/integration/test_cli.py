"""The core's sub-commands as a user runs them: check-config, --help, --version."""

from __future__ import annotations

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
