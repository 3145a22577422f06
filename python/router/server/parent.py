"""A worker's tie to its supervisor: when the supervisor dies, the kernel signals the worker,
which drains, exits and removes the supervisor's private directory on its way out."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
from collections.abc import Callable

from router.errors import StartupError

_PR_SET_PDEATHSIG = 1

# What the kernel sends a worker when its supervisor dies: a signal of its own, so the worker
# knows why it stops. getppid() cannot tell: the kernel signals when the supervisor's main thread
# exits, and until its other threads have exited too, the worker's parent is still that process.
# It signals again as each of those threads exits (the worker passes from one to the next), so
# the signal's handler is a plain one, installed before the tie is made and kept for the life of
# the process: the event loop never owns it (and never resets it to the default, which ends the
# process), and every repeat, at startup, while serving, draining or exiting, is only noted.
GONE = signal.SIGUSR2


class _Watch:
    """Whether the supervisor died, and what to do the first time it is seen to."""

    def __init__(self) -> None:
        self.gone = False
        self.then: Callable[[], object] | None = None

    def signalled(self, signum: int, frame: object) -> None:
        first = not self.gone
        self.gone = True
        if first and self.then is not None:
            self.then()


_WATCH = _Watch()


def watch() -> None:
    """Note GONE from now on (follow() does this first)."""
    signal.signal(GONE, _WATCH.signalled)


def follow(supervisor: int) -> None:
    """Have the kernel send this process GONE when its parent dies (Linux), so a worker whose
    supervisor was killed outright drains and exits instead of serving on, orphaned, on the
    listener it shares with the next supervisor's workers. StartupError if `supervisor` is
    already gone (it died while this worker was starting)."""
    watch()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, GONE, 0, 0, 0) != 0:
            raise StartupError(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    # Checked after the tie is made: a supervisor that died before it would send nothing.
    if os.getppid() != supervisor:
        raise StartupError(f"the supervisor (pid {supervisor}) exited before this worker started")


def on_gone(then: Callable[[], object]) -> None:
    """Call `then` (once) when the supervisor dies; at once if it already has."""
    _WATCH.then = then
    if _WATCH.gone:
        then()


def orphaned() -> bool:
    """Whether the supervisor died (GONE came at any time: before, while or after serving)."""
    return _WATCH.gone


def clean_up(machine_dir: str) -> None:
    """Remove a dead supervisor's private directory (its tables and sockets), which it had no
    chance to: the first orphaned worker out does; its siblings, draining too, keep the tables
    they opened (the sockets only served the dead supervisor)."""
    shutil.rmtree(machine_dir, ignore_errors=True)
