"""A throttled one-line progress report on stderr while a run is going."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Prints at most one line per `interval_s`; rewrites in place on a terminal."""

    def __init__(self, name: str, interval_s: float = 1.0, out: TextIO | None = None) -> None:
        self.name = name
        self.interval_s = interval_s
        self.out = out if out is not None else sys.stderr
        self._last = float("-inf")
        self._tty = self.out.isatty()

    def update(
        self,
        elapsed_s: float,
        *,
        sent: int,
        done: int,
        errors: int,
        in_flight: int,
        force: bool = False,
    ) -> None:
        """Report the counters now if the interval has passed (or `force`)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        rps = done / elapsed_s if elapsed_s > 0 else 0.0
        line = (
            f"[{self.name}] {elapsed_s:6.1f}s sent {sent} done {done} errors {errors} "
            f"in-flight {in_flight} {rps:.1f} req/s"
        )
        if self._tty:
            self.out.write("\r\x1b[2K" + line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def finish(self) -> None:
        """End the in-place line."""
        if self._tty:
            self.out.write("\n")
            self.out.flush()
