"""The .pyi stub matches the compiled module; the facade re-exports it."""

from __future__ import annotations

import subprocess
import sys

import router
import router._native
from tests.support import REPO


def test_stubtest_passes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "router._native"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_facade_reexports_native_names() -> None:
    for name in router._native.__all__:
        assert getattr(router, name) is getattr(router._native, name)
    assert set(router._native.__all__) <= set(router.__all__)


def test_help_shows_docstrings() -> None:
    for obj in (router.fingerprint, router.count_request_tokens, router.BucketTable.try_acquire):
        assert obj.__doc__
