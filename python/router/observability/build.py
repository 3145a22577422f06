"""What runs: the package version and the git commit it was built from."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from router import __version__

# python/router in a source checkout (an editable install), site-packages/router in a wheel's.
_PACKAGE = Path(__file__).resolve().parent.parent


def _checkout_commit(package: Path) -> str:
    """HEAD of the source checkout whose python/ folder holds `package`, else ""."""
    # An installed wheel's site-packages may sit in another git work tree (a venv inside a
    # deployment repository, or inside a router checkout): that tree's HEAD is not what runs.
    checkout = package.parent.parent
    if package.parent.name != "python" or not (checkout / "Cargo.toml").is_file():
        return ""
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


@functools.cache
def build_info() -> tuple[str, str]:
    """(version, commit): ROUTER_BUILD_COMMIT when a packager set it, else the checkout's HEAD
    (an editable install), else "unknown" (an installed wheel)."""
    commit = os.environ.get("ROUTER_BUILD_COMMIT", "").strip() or _checkout_commit(_PACKAGE)
    return __version__, commit or "unknown"
