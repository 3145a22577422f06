"""build_info: the commit of a source checkout, never that of a git tree a wheel is installed in."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from router import __version__
from router.observability import build


def _git_repo(path: Path) -> str:
    """A git repository at `path` with one commit; its short HEAD."""
    path.mkdir(parents=True)

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, check=True, timeout=10
        )
        return done.stdout.strip()

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "t")
    return git("rev-parse", "--short=12", "HEAD")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("ROUTER_BUILD_COMMIT", raising=False)
    build.build_info.cache_clear()
    yield
    build.build_info.cache_clear()


def test_a_source_checkout_reports_its_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _git_repo(tmp_path / "router")
    (tmp_path / "router" / "Cargo.toml").write_text("")
    (tmp_path / "router" / "python" / "router").mkdir(parents=True)
    monkeypatch.setattr(build, "_PACKAGE", tmp_path / "router" / "python" / "router")
    assert build.build_info() == (__version__, head)


def test_a_wheel_installed_inside_another_git_tree_reports_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _git_repo(tmp_path / "deploy")
    site = tmp_path / "deploy" / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "router").mkdir(parents=True)
    monkeypatch.setattr(build, "_PACKAGE", site / "router")
    assert build.build_info() == (__version__, "unknown")
    build.build_info.cache_clear()
    monkeypatch.setenv("ROUTER_BUILD_COMMIT", "abc123")
    assert build.build_info() == (__version__, "abc123")
