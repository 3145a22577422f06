"""The access log line: JSON fields, plain format, levels, and no credentials."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import shlex
from collections.abc import Iterator

import pytest

from router.observability.access_log import (
    FLUSH_BYTES,
    SHARED_WRITE_BYTES,
    AccessLog,
    AccessRecord,
)


@pytest.fixture
def stream() -> io.StringIO:
    return io.StringIO()


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """No foreign handlers on the logger (pytest adds capture handlers while a test runs)."""
    logger = logging.getLogger("router.access")
    saved = logger.handlers[:]
    logger.handlers[:] = [h for h in saved if type(h).__name__ == "_AccessHandler"]
    try:
        yield
    finally:
        logger.handlers[:] = saved


def test_json_line_has_every_field(stream: io.StringIO) -> None:
    log = AccessLog(stream=stream)
    try:
        log.emit(
            AccessRecord(
                request_id="abc", path="/v1/chat/completions", status=200, tenant="acme",
                model="m", region="eu", attempts=2, retries=1, cache="miss", stream=True,
                stages={"auth": 41_000, "total": 12_500_000}, tokens_in=12, tokens_out=34,
            )
        )  # fmt: skip
    finally:
        log.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["request_id"] == "abc"
    assert line["tenant"] == "acme"
    assert line["region"] == "eu"
    assert line["attempts"] == 2
    assert line["cache"] == "miss"
    assert line["status"] == 200
    assert line["stages_us"] == {"auth": 41, "total": 12500}
    assert (line["tokens_in"], line["tokens_out"]) == (12, 34)
    assert isinstance(line["ts"], float)


def test_plain_format_and_level(stream: io.StringIO) -> None:
    log = AccessLog(stream=stream, fmt="plain", level="warning")
    try:
        log.emit(AccessRecord(request_id="ok", status=200))
        log.emit(AccessRecord(request_id="bad", status=502, stages={"total": 3_000_000}))
    finally:
        log.close()
    out = stream.getvalue()
    assert "ok" not in out.split()
    assert " bad POST - 502 " in out
    assert "total=3.0ms" in out


FORGED = "2026-12-05T11:47:00 00000000-0000-4000-8000-000000000000 POST /v1/x 200 tenant=admin"


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("model", f"x\n{FORGED}", '"x\\n2026-12-05T11:47:00 '),
        ("model", "m tenant=admin", '"m tenant=admin"'),
        ("path", f"/v1/nope\r\n{FORGED}", '"/v1/nope\\r\\n2026-12-05T11:47:00 '),
        ("path", '/v1/a\u2028b\x1b[2J\\"', '"/v1/a\\u2028b\\x1b[2J\\\\\\""'),
        ("tenant", "t\x85x", '"t\\x85x"'),
    ],
)
def test_plain_fields_cannot_forge_lines_or_fields(
    stream: io.StringIO, field: str, value: str, shown: str
) -> None:
    log = AccessLog(stream=stream, fmt="plain")
    try:
        log.emit(AccessRecord(request_id="r1", status=404, **{field: value}))
    finally:
        log.close()
    (line,) = stream.getvalue().splitlines()
    assert shown in line
    # Read back as shell-style words, the value is one word: it made no field of its own.
    words = shlex.split(line)
    assert sum(w.startswith("tenant=") for w in words) == 1
    assert len(words) == 12
    # A plain field is the value itself when nothing in it needs escaping.
    stream.seek(0)
    stream.truncate()
    log = AccessLog(stream=stream, fmt="plain")
    try:
        log.emit(
            AccessRecord(request_id="r2", status=200, path="/v1/chat/completions", model="é/m-1")
        )
    finally:
        log.close()
    assert " POST /v1/chat/completions 200 tenant=- model=é/m-1 " in stream.getvalue()


def test_disabled_log_writes_nothing(stream: io.StringIO) -> None:
    log = AccessLog(stream=stream, enabled=False)
    log.emit(AccessRecord(request_id="x", status=200))
    log.close()
    assert stream.getvalue() == ""


def test_record_has_no_place_for_credentials() -> None:
    # The line is built only from AccessRecord; a key can only leak if a field is added for it.
    fields = set(AccessRecord.__struct_fields__)
    assert not {f for f in fields if "key" in f or "auth" in f or "header" in f}


def test_a_second_log_replaces_the_first_handler(stream: io.StringIO) -> None:
    other = io.StringIO()
    first = AccessLog(stream=other)
    second = AccessLog(stream=stream)
    try:
        second.emit(AccessRecord(request_id="once", status=200))
    finally:
        first.close()
        second.close()
    assert other.getvalue() == ""
    assert stream.getvalue().count("once") == 1


def test_other_handlers_on_the_logger_get_the_line_too(stream: io.StringIO) -> None:
    log = AccessLog(stream=stream)
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    extra = Collect()
    logging.getLogger("router.access").addHandler(extra)
    try:
        log.emit(AccessRecord(request_id="both", status=503))
    finally:
        logging.getLogger("router.access").removeHandler(extra)
        log.close()
    assert len(seen) == 1
    assert json.loads(seen[0])["request_id"] == "both"
    assert json.loads(stream.getvalue())["status"] == 503


async def test_lines_are_batched_inside_an_event_loop(stream: io.StringIO) -> None:
    log = AccessLog(stream=stream, flush_interval_s=0.05)
    with alone():
        try:
            log.emit(AccessRecord(request_id="first", status=200))
            log.emit(AccessRecord(request_id="second", status=200))
            assert stream.getvalue() == ""
            await asyncio.sleep(0.2)
            lines = stream.getvalue().splitlines()
            assert [json.loads(x)["request_id"] for x in lines] == ["first", "second"]
            log.emit(AccessRecord(request_id="third", status=200))
            assert "third" not in stream.getvalue()
        finally:
            log.close()
    # close() writes what is pending.
    assert json.loads(stream.getvalue().splitlines()[-1])["request_id"] == "third"


async def test_a_full_buffer_is_written_at_once(stream: io.StringIO) -> None:
    log = AccessLog(stream=stream, flush_interval_s=60.0)
    with alone():
        try:
            big = "m" * 1000
            n = FLUSH_BYTES // 1000 + 1
            for i in range(n):
                log.emit(AccessRecord(request_id=str(i), status=200, model=big))
            # Written when the pending lines reached FLUSH_BYTES, not 60 s later.
            assert len(stream.getvalue()) >= FLUSH_BYTES
            assert len(stream.getvalue().splitlines()) < n
        finally:
            log.close()
    assert len(stream.getvalue().splitlines()) == n


def test_outside_an_event_loop_every_line_is_written_at_once(stream: io.StringIO) -> None:
    log = AccessLog(stream=stream, flush_interval_s=60.0)
    try:
        log.emit(AccessRecord(request_id="now", status=200))
        assert json.loads(stream.getvalue())["request_id"] == "now"
    finally:
        log.close()
    with pytest.raises(ValueError, match="flush_interval_s"):
        AccessLog(stream=stream, flush_interval_s=-1.0)


class _Writes(io.StringIO):
    """Records each write, as each becomes one write(2) on a pipe once flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def test_a_shared_stdout_gets_whole_lines_in_atomic_writes() -> None:
    out = _Writes()

    async def burst() -> None:
        log = AccessLog(stream=out, flush_interval_s=60.0, shared_stream=True)
        with alone():
            for i in range(200):
                log.emit(AccessRecord(request_id=f"req-{i:05d}", status=200, path="/v1/x" * 10))
            log.close()

    asyncio.run(burst())
    assert len(out.writes) > 1
    for chunk in out.writes:
        assert len(chunk.encode()) <= SHARED_WRITE_BYTES
        assert chunk.endswith("\n")
    ids = [json.loads(line)["request_id"] for line in out.getvalue().splitlines()]
    assert ids == [f"req-{i:05d}" for i in range(200)]
