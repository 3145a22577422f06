"""Operational logs: the configured format, credentials redacted from every line, and a
malformed request as one short line instead of aiohttp's traceback with the raw bytes."""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Literal

import msgspec

from router.net.redaction import redact

LogFormat = Literal["json", "plain"]


class Redactor(logging.Filter):
    """Rewrites each record's message and traceback with credentials redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class MalformedRequests(logging.Filter):
    """aiohttp's "Error handling request" (a request it could not parse, logged at ERROR with a
    traceback whose message holds the raw bytes) becomes one INFO line with the client and the
    parser's reason, at most `per_second` lines a second so a client cannot flood the log."""

    def __init__(self, per_second: int = 10) -> None:
        super().__init__()
        self.per_second = per_second
        self._second = 0
        self._count = 0
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Error handling request")):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        now = int(time.monotonic())
        if now != self._second:
            self._second, self._count = now, 0
        self._count += 1
        if self._count > self.per_second:
            self.suppressed += 1
            return False
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        reason = _parser_reason(exc)
        record.msg = "malformed request from %s: %s"
        record.args = (peer, reason)
        if self.suppressed:
            record.msg += " (%d more not logged)"
            record.args = (peer, reason, self.suppressed)
            self.suppressed = 0
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def _parser_reason(exc: BaseException | None) -> str:
    """The parser's complaint without the bytes it quotes (aiohttp appends them after a newline
    or in a `message=` repr)."""
    if exc is None:
        return "unparsable request"
    status = getattr(exc, "code", 400)
    text = str(getattr(exc, "message", "") or type(exc).__name__)
    first = text.split("\n", 1)[0].split(":", 1)[0].strip()[:80]
    return f"{status} {type(exc).__name__}: {first}" if first else f"{status} {type(exc).__name__}"


class _JsonLine(msgspec.Struct, omit_defaults=True):
    ts: float
    level: str
    logger: str
    msg: str
    exc: str | None = None


_encode = msgspec.json.Encoder().encode


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the access log's shape: ts, level, logger, msg (exc)."""

    def format(self, record: logging.LogRecord) -> str:
        exc = record.exc_text
        if exc is None and record.exc_info:
            exc = self.formatException(record.exc_info)
        line = _JsonLine(
            ts=round(record.created, 3),
            level=record.levelname.lower(),
            logger=record.name,
            msg=record.getMessage(),
            exc=exc,
        )
        return _encode(line).decode()


PLAIN = "%(asctime)s %(name)s %(levelname)s %(message)s"
# Loggers whose records reach the operator: the router's, and aiohttp's own.
_HTTP_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access")


def configure(level: str = "info", fmt: LogFormat = "plain", stream: IO[str] | None = None) -> None:
    """Route every logger through one handler on stderr: the format asked for, every line
    redacted, malformed requests shortened. Replaces a previous configure()."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "router_ops", False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.router_ops = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(PLAIN))
    handler.addFilter(Redactor())
    root.addHandler(handler)
    root.setLevel(level.upper())
    malformed = MalformedRequests()
    for name in _HTTP_LOGGERS:
        logger = logging.getLogger(name)
        for stale in [f for f in logger.filters if isinstance(f, MalformedRequests)]:
            logger.removeFilter(stale)
        logger.addFilter(malformed)
