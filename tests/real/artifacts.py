"""Where the real-server tier keeps what it builds: one cache directory outside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

# The llama-cpp-python release whose sdist (with its vendored llama.cpp) both servers come from.
LLAMA_CPP_PYTHON = "0.3.36"

MISSING_HINT = "run `make real-servers` (python -m tests.real.build) to build them"


class ArtifactsMissing(RuntimeError):
    """A built server or the installed wheel is not in the cache."""


def cache_root() -> Path:
    """${ROUTER_REAL_CACHE:-$HOME/.cache/router-real}."""
    env = os.environ.get("ROUTER_REAL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "router-real"


def version_dir() -> Path:
    return cache_root() / LLAMA_CPP_PYTHON


def llama_server_bin() -> Path:
    """The llama-server binary, with its shared libraries beside it (RPATH $ORIGIN)."""
    return version_dir() / "bin" / "llama-server"


def venv_python() -> Path:
    """The interpreter of the venv that holds llama-cpp-python[server] (not the test one)."""
    return version_dir() / "venv" / "bin" / "python"


def require() -> None:
    """Raise ArtifactsMissing, naming what is missing, unless both servers are built."""
    missing = [
        str(path)
        for path in (llama_server_bin(), version_dir() / "venv" / ".installed")
        if not path.exists()
    ]
    if missing:
        raise ArtifactsMissing(
            f"real-server artifacts missing ({', '.join(missing)}): {MISSING_HINT}"
        )
