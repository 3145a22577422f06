"""The core's sub-commands as a user runs them: check-config, --help, --version."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import REPO, router_cmd


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
