"""Run a hop (a module, as `python -m` would) with its Python counted: bench/opcodes' launcher.

    python bench/_opcode_hop.py OUT WARMUP REQUESTS -- router serve --config CONFIG

Run as a script, with the tree under test on PYTHONPATH: it imports nothing of the router, so
any checkout's hop can be counted. After WARMUP requests it counts the bytecodes each of the
next REQUESTS runs (sys.settrace opcode events, per code object), from the request's first bytes
to its first write to the client (`critical`) and to the end of its handling (`whole`); then it
writes them to OUT as JSON and stops counting.
"""

from __future__ import annotations

import json
import runpy
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from aiohttp import http_writer, web_protocol

_METHODS = (b"POST ", b"GET ", b"PUT ", b"HEAD ", b"DELETE ")
_HERE = __file__


class _Counts:
    """Which phase the one request being counted is in, and what each phase ran."""

    def __init__(self, out: Path, warmup: int, requests: int) -> None:
        self.out, self.warmup, self.requests = out, warmup, requests
        self.seen = 0
        self.counted = 0
        # 0: not counting; 1: before the first write to the client; 2: after it.
        self.phase = 0
        self.critical: Counter[tuple[str, str]] = Counter()
        self.whole: Counter[tuple[str, str]] = Counter()

    def begin(self) -> None:
        self.seen += 1
        if self.warmup < self.seen <= self.warmup + self.requests:
            self.phase = 1

    def wrote(self) -> None:
        if self.phase == 1:
            self.phase = 2

    def end(self) -> None:
        if self.phase == 0:
            return
        self.phase = 0
        self.counted += 1
        if self.counted == self.requests:
            rows = {
                "critical": [[f, n, v] for (f, n), v in self.critical.items()],
                "whole": [[f, n, v] for (f, n), v in self.whole.items()],
            }
            self.out.write_text(json.dumps({"requests": self.counted, **rows}))

    def tracer(self, frame: FrameType, event: str, arg: object) -> Callable[..., Any] | None:
        if self.phase == 0 or frame.f_code.co_filename == _HERE:
            return None
        frame.f_trace_opcodes = True
        key = (frame.f_code.co_filename, frame.f_code.co_name)

        def local(frame: FrameType, event: str, arg: object) -> Callable[..., Any]:
            if event == "opcode":
                if self.phase == 1:
                    self.critical[key] += 1
                if self.phase:
                    self.whole[key] += 1
            return local

        return local


def _instrument(counts: _Counts) -> None:
    read = web_protocol.RequestHandler.data_received

    def data_received(self: web_protocol.RequestHandler, data: bytes) -> None:
        if data.startswith(_METHODS):
            counts.begin()
        read(self, data)

    finish = web_protocol.RequestHandler.finish_response

    async def finish_response(self: web_protocol.RequestHandler, *args: Any) -> Any:
        try:
            return await finish(self, *args)
        finally:
            counts.end()

    def wrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
        def write(*args: Any) -> Any:
            counts.wrote()
            return fn(*args)

        return write

    web_protocol.RequestHandler.data_received = data_received  # type: ignore[method-assign]
    web_protocol.RequestHandler.finish_response = finish_response  # type: ignore[method-assign,assignment]
    for name in ("_write", "_writelines"):
        setattr(http_writer.StreamWriter, name, wrapped(getattr(http_writer.StreamWriter, name)))


def main(argv: list[str]) -> None:
    # Run as a script, its own folder came first on sys.path: bench's modules are not top-level.
    if sys.path and Path(sys.path[0]).resolve() == Path(_HERE).resolve().parent:
        sys.path.pop(0)
    out, warmup, requests, dashes, module, *rest = argv
    assert dashes == "--", "usage: OUT WARMUP REQUESTS -- MODULE ARGS..."
    counts = _Counts(Path(out), int(warmup), int(requests))
    _instrument(counts)
    sys.argv = [module, *rest]
    sys.settrace(counts.tracer)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
