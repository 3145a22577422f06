"""RequestContext: what the router knows about one client request as it moves through the stages."""

from __future__ import annotations

import os
import random
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.core.request import ParsedRequest

# Request ids a client may choose: short, printable, no separators that would break a log line.
_ID_MAX = 128
_ID_OK = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
# Ids correlate log lines, they guard nothing: a PRNG seeded from the OS saves a getrandom(2)
# system call per request.
_IDS = random.Random(os.urandom(16))


def request_id(header: str | None) -> str:
    """The client's x-request-id if it is sane, otherwise a fresh random one."""
    if (
        header
        and len(header) <= _ID_MAX
        and header.isascii()
        and _ID_OK.issuperset(header.encode())
    ):
        return header
    return f"{_IDS.getrandbits(96):024x}"


class StageTimer:
    """Records named stage durations (ns) in order; the metrics feature renders Server-Timing."""

    __slots__ = ("_open", "stages", "start_ns")

    def __init__(self) -> None:
        self.start_ns = time.perf_counter_ns()
        self.stages: list[tuple[str, int]] = []
        self._open: dict[str, int] = {}

    def begin(self, name: str) -> None:
        """Start timing stage `name`."""
        self._open[name] = time.perf_counter_ns()

    def end(self, name: str) -> None:
        """Stop timing stage `name` (a no-op if it was never begun)."""
        began = self._open.pop(name, None)
        if began is not None:
            self.stages.append((name, time.perf_counter_ns() - began))

    def record(self, name: str, duration_ns: int) -> None:
        """Add a stage measured elsewhere."""
        self.stages.append((name, duration_ns))

    def elapsed_ns(self) -> int:
        """Nanoseconds since the request arrived."""
        return time.perf_counter_ns() - self.start_ns


class RequestContext:
    """One client request: id, endpoint, parsed body, routing outcome and timings."""

    __slots__ = ("attempts", "endpoint", "extra", "parsed", "region", "request_id", "timer")

    def __init__(self, request_id: str, endpoint: str) -> None:
        self.request_id = request_id
        # The upstream path, e.g. "/v1/chat/completions".
        self.endpoint = endpoint
        self.parsed: ParsedRequest | None = None
        # Name of the region that answered (or the last one tried).
        self.region: str | None = None
        self.attempts = 0
        self.timer = StageTimer()
        # Per-feature scratch space (tenant, cache key, deployment, ...), keyed by feature name.
        self.extra: dict[str, object] = {}

    @property
    def request(self) -> ParsedRequest:
        """The parsed request; only valid after the parse stage."""
        assert self.parsed is not None, "request not parsed yet"
        return self.parsed
