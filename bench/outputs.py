"""Where the bench scripts write (--json FILE, --results DIR), checked before any load starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from router.loadgen.report import prepare_folder


def _fail(parser: argparse.ArgumentParser, flag: str, path: Path, exc: OSError) -> None:
    # One line and the usage-error status: the run never started, so nothing was lost.
    parser.exit(2, f"{parser.prog}: error: {flag} {path}: {exc.strerror or exc}\n")


def check_file(parser: argparse.ArgumentParser, flag: str, path: Path | None) -> None:
    """Exit 2 in one line unless `path` can be written (a new file is created, then removed)."""
    if path is None:
        return
    existed = path.exists()
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a folder", str(path))
        with path.open("a"):
            pass
    except OSError as exc:
        _fail(parser, flag, path, exc)
    if not existed:
        path.unlink(missing_ok=True)


def check_folder(parser: argparse.ArgumentParser, flag: str, path: Path) -> None:
    """Exit 2 in one line unless `path` is (or can be made) a folder a file can be written in."""
    try:
        prepare_folder(path)
    except OSError as exc:
        _fail(parser, flag, path, exc)
