"""Structured access log: one line per request on the `router.access` logger."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import IO, Literal

import msgspec

LogFormat = Literal["json", "plain"]
CacheResult = Literal["hit", "miss", "bypass", "none"]

LOGGER_NAME = "router.access"


class AccessRecord(msgspec.Struct, kw_only=True):
    """What one finished request did; the access log line and the metrics are built from it.

    It carries no credentials by construction: there is no field for headers or keys.
    """

    request_id: str
    method: str = "POST"
    path: str = ""
    status: int
    tenant: str | None = None
    model: str | None = None
    # The rollout version the model resolved to (an alias's, or the model itself).
    version: str | None = None
    region: str | None = None
    attempts: int = 0
    retries: int = 0
    failovers: int = 0
    hedges: int = 0
    cache: CacheResult = "none"
    stream: bool = False
    # Nanoseconds per stage (timing.STAGES); the log renders them in ms.
    stages: dict[str, int] = msgspec.field(default_factory=dict)
    tokens_in: int | None = None
    tokens_out: int | None = None
    error: str | None = None
    # Ended by the router's own shutdown (a drain's deadline), not by its region or client.
    drained: bool = False
    # The router answered itself: its admission was full at the last region tried, which never
    # saw the request (`region` names it); the metrics count it under no region.
    refused: bool = False


class _Line(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The JSON shape of one access log line."""

    ts: float
    request_id: str
    method: str
    path: str
    status: int
    tenant: str | None = None
    model: str | None = None
    # The rollout version the model resolved to (an alias's, or the model itself).
    version: str | None = None
    region: str | None = None
    attempts: int = 0
    retries: int = 0
    failovers: int = 0
    hedges: int = 0
    cache: str = "none"
    stream: bool = False
    # Microseconds as ints: exact enough, and far cheaper to render than rounded floats.
    stages_us: dict[str, int] = msgspec.field(default_factory=dict)
    tokens_in: int | None = None
    tokens_out: int | None = None
    error: str | None = None
    # Ended by the router's own shutdown (a drain's deadline), not by its region or client.
    drained: bool = False


_encode = msgspec.json.Encoder().encode


def render_json(record: AccessRecord, ts: float) -> str:
    """One JSON object, no newline."""
    line = _Line(
        ts=round(ts, 3),
        request_id=record.request_id,
        method=record.method,
        path=record.path,
        status=record.status,
        tenant=record.tenant,
        model=record.model,
        version=record.version,
        region=record.region,
        attempts=record.attempts,
        retries=record.retries,
        failovers=record.failovers,
        hedges=record.hedges,
        cache=record.cache,
        stream=record.stream,
        stages_us={n: ns // 1000 for n, ns in record.stages.items()},
        tokens_in=record.tokens_in,
        tokens_out=record.tokens_out,
        error=record.error,
        drained=record.drained,
    )
    return _encode(line).decode()


# A plain field holding one of these, or anything unprintable (control characters, line and
# paragraph separators), is written double-quoted with them escaped.
_QUOTED = frozenset(' "\\')
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"}


def _field(value: str | None) -> str:
    """A client-controlled value as one plain-format field: as it is when printable without a
    space, quote or backslash, else quoted and escaped, so it can neither end the line nor pose
    as another field."""
    if not value:
        return "-"
    if value.isprintable() and _QUOTED.isdisjoint(value):
        return value
    return '"' + "".join(map(_escaped, value)) + '"'


def _escaped(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def render_plain(record: AccessRecord, ts: float) -> str:
    """A compact human line: `<id> POST /v1/chat/completions 200 eu-west miss 2 12.3ms ...`."""
    total = record.stages.get("total")
    total_ms = "-" if total is None else f"{total / 1e6:.1f}ms"
    stages = " ".join(f"{n}={ns / 1e6:.3f}" for n, ns in record.stages.items() if n != "total")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    return (
        f"{stamp} {_field(record.request_id)} {_field(record.method)} {_field(record.path)} "
        f"{record.status} tenant={_field(record.tenant)} model={_field(record.model)} "
        f"region={_field(record.region)} cache={record.cache} attempts={record.attempts} "
        f"tokens={record.tokens_in or 0}/{record.tokens_out or 0} total={total_ms} {stages}"
        + ("" if record.error is None else f" error={_field(record.error)}")
    ).rstrip()


class _MessageOnly(logging.Formatter):
    """The line is already rendered; the formatter adds nothing."""

    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage()


# A buffer this big is written at once, whatever the flush interval.
FLUSH_BYTES = 64 * 1024
# With worker processes sharing one stdout pipe, each write holds whole lines and at most this
# many bytes: POSIX makes pipe writes up to PIPE_BUF atomic, so lines never interleave.
SHARED_WRITE_BYTES = 4096


class AccessLog:
    """Writes one line per request to `router.access` (stdout unless a stream is given).

    Inside an event loop, lines are buffered and written together at most `flush_interval_s`
    after the first of them (or once FLUSH_BYTES are waiting), like Envoy's access log flush:
    one write per batch instead of a write and a flush per request. 0 writes every line at
    once; so does emitting outside an event loop. `flush()`/`close()` write what is pending.
    """

    __slots__ = (
        "_clock",
        "_handler",
        "_interval",
        "_logger",
        "_pending",
        "_pending_bytes",
        "_render",
        "_shared",
        "_stream",
        "_timer",
        "enabled",
    )

    def __init__(
        self,
        *,
        level: str = "info",
        fmt: LogFormat = "json",
        stream: IO[str] | None = None,
        enabled: bool = True,
        flush_interval_s: float = 0.0,
        shared_stream: bool = False,
    ) -> None:
        if flush_interval_s < 0:
            raise ValueError(f"flush_interval_s must be >= 0, got {flush_interval_s}")
        self._logger = logging.getLogger(LOGGER_NAME)
        self._logger.setLevel(level.upper())
        # Access lines are not application logs: keep them off the root logger's handlers.
        self._logger.propagate = False
        for old in [h for h in self._logger.handlers if isinstance(h, _AccessHandler)]:
            self._logger.removeHandler(old)
        self._stream = stream if stream is not None else sys.stdout
        self._handler = _AccessHandler(self._stream)
        self._logger.addHandler(self._handler)
        self._render = render_json if fmt == "json" else render_plain
        self._clock = time.time
        self._interval = flush_interval_s
        # Other processes write to the same stream (router serve --workers N).
        self._shared = shared_stream
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self.enabled = enabled

    def emit(self, record: AccessRecord) -> None:
        """Log the request at INFO (at WARNING when it failed on our side)."""
        if not self.enabled:
            return
        level = logging.WARNING if record.status >= 500 else logging.INFO
        logger = self._logger
        if not logger.isEnabledFor(level):
            return
        line = self._render(record, self._clock())
        handlers = logger.handlers
        if len(handlers) == 1 and handlers[0] is self._handler:
            # Only our handler listens: write the line directly. The logging machinery
            # (LogRecord, caller lookup, handler lock) would cost more than the rest of the
            # request's observability together; one event loop thread makes this safe.
            self._pending.append(line)
            self._pending_bytes += len(line)
            if self._interval == 0 or self._pending_bytes >= FLUSH_BYTES:
                self.flush()
            elif self._timer is None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    self.flush()
                else:
                    self._timer = loop.call_later(self._interval, self.flush)
        else:
            logger.log(level, line)

    def flush(self) -> None:
        """Write every pending line now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        lines, self._pending, self._pending_bytes = self._pending, [], 0
        if self._shared:
            self._write_shared(lines)
            return
        lines.append("")
        self._stream.write("\n".join(lines))
        self._stream.flush()

    def _write_shared(self, lines: list[str]) -> None:
        """Whole lines in writes of at most SHARED_WRITE_BYTES (one line may be longer)."""
        chunk: list[str] = []
        size = 0
        for line in lines:
            if chunk and size + len(line) + 1 > SHARED_WRITE_BYTES:
                self._stream.write("\n".join(chunk) + "\n")
                self._stream.flush()
                chunk, size = [], 0
            chunk.append(line)
            size += len(line) + 1
        if chunk:
            self._stream.write("\n".join(chunk) + "\n")
            self._stream.flush()

    def close(self) -> None:
        """Write what is pending and detach the handler this log added."""
        self.flush()
        self._logger.removeHandler(self._handler)
        self._handler.flush()


class _AccessHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler an AccessLog installs; the line is already rendered."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        self.setFormatter(_MessageOnly())
