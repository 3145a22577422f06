"""Run a hop (a module, as `python -m` would) with its cycle-collector passes timed:
bench/gc_pauses' launcher.

    python bench/_gc_hop.py OUT -- router serve --config CONFIG

Run as a script, with the tree under test on PYTHONPATH: it imports nothing of the router, so
any checkout's hop can be timed. Every pass after startup (once the server froze its startup
objects, or after the first second when it never does) is noted by gc.callbacks: its
generation, duration and the objects it collected; on SIGUSR1 the notes so far go to OUT as
JSON.
"""

from __future__ import annotations

import gc
import json
import runpy
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

_HERE = __file__


class _Passes:
    """The collector's passes since startup: (generation, seconds, objects collected)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.began = 0.0
        self.started = time.monotonic()
        self.passes: list[tuple[int, float, int]] = []

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.began = time.perf_counter()
            return
        took = time.perf_counter() - self.began
        if gc.get_freeze_count() or time.monotonic() - self.started > 1.0:
            self.passes.append((info["generation"], took, info["collected"]))

    def dump(self, signum: int, frame: FrameType | None) -> None:
        self.out.write_text(json.dumps({"passes": self.passes}))


def main(argv: list[str]) -> None:
    # Run as a script, its own folder came first on sys.path: bench's modules are not top-level.
    if sys.path and Path(sys.path[0]).resolve() == Path(_HERE).resolve().parent:
        sys.path.pop(0)
    out, dashes, module, *rest = argv
    assert dashes == "--", "usage: OUT -- MODULE ARGS..."
    passes = _Passes(Path(out))
    gc.callbacks.append(passes.callback)
    signal.signal(signal.SIGUSR1, passes.dump)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
