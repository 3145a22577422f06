"""deploy/router.service passes `systemd-analyze verify` with no complaint about it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO

UNIT = REPO / "deploy" / "router.service"


def test_unit_file_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # verify checks that ExecStart names an executable: stand one in for the installed router.
    router = tmp_path / "router"
    router.write_text("#!/bin/sh\nexit 0\n")
    router.chmod(0o755)
    text = UNIT.read_text().replace("/opt/router/venv/bin/router", str(router))
    assert str(router) in text
    unit = tmp_path / "router.service"
    unit.write_text(text)
    out = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [ln for ln in (out.stdout + out.stderr).splitlines() if "router.service" in ln]
    assert out.returncode == 0, out.stderr
    assert complaints == []


def test_unit_reloads_with_sighup_and_stops_with_sigterm() -> None:
    text = UNIT.read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text
    assert "KillSignal=SIGTERM" in text
    assert "ExecStart=/opt/router/venv/bin/router serve --config /etc/router/router.toml" in text
