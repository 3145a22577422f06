"""The access log line: JSON fields, plain format, levels, and no credentials."""

from __future__ import annotations

import io
import json
import logging

import pytest

from router.accesslog import AccessLog, AccessRecord


@pytest.fixture
def stream() -> io.StringIO:
    return io.StringIO()


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
    assert " bad POST  502 " in out
    assert "total=3.0ms" in out


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
