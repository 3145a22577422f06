"""What runs: the package version and the git commit it was built from."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from router import __version__

_PACKAGE = Path(__file__).resolve().parent.parent


@functools.cache
def build_info() -> tuple[str, str]:
    """(version, commit): ROUTER_BUILD_COMMIT when a packager set it, else the checkout's HEAD
    (an editable install), else "unknown"."""
    commit = os.environ.get("ROUTER_BUILD_COMMIT", "").strip()
    if not commit:
        try:
            out = subprocess.run(
                ["git", "-C", str(_PACKAGE), "rev-parse", "--short=12", "HEAD"],
                capture_output=True,
                text=True,
                timeout=2,
                check=False,
            )
            commit = out.stdout.strip() if out.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            commit = ""
    return __version__, commit or "unknown"
