"""A bounded atheris (libFuzzer) run over the native entry points: no crash, no panic, no
exception but NativeError."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

pytest.importorskip("atheris", reason="atheris is a dev dependency: pip install -e '.[dev]'")

SECONDS = int(os.environ.get("ROUTER_FUZZ_SECONDS", "15"))


@pytest.mark.timeout(SECONDS + 60)
def test_native_fuzz_bounded(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(REPO / "fuzz" / "corpus", corpus)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "fuzz" / "fuzz_native.py"),
            f"-max_total_time={SECONDS}",
            "-rss_limit_mb=4096",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=SECONDS + 45,
        check=False,
    )
    tail = result.stderr[-3000:]
    assert result.returncode == 0, tail
    assert "Done" in result.stderr, tail
    assert not list(tmp_path.glob("crash-*")), tail
