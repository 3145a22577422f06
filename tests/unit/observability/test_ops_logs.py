"""Operational log lines: credentials redacted wherever they appear, the JSON shape."""

from __future__ import annotations

import io
import json
import logging

import pytest

from router.net.redaction import REDACTED, display_url, redact
from router.observability.logs import configure

CASES = [
    ("redis down: redis://:hunter2@10.0.0.5:6379/0", "hunter2"),
    ("redis down: rediss://app:hunter2@cache:6380", "hunter2"),
    ("headers: {'Authorization': 'Bearer sk-abc123def456ghi'}", "sk-abc123def456ghi"),
    ("Authorization: Bearer tok_9f8e7d6c5b4a", "tok_9f8e7d6c5b4a"),
    ("authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ('{"x-api-key": "k-12345678"}', "k-12345678"),
    ("x-api-key=abcdefgh", "abcdefgh"),
    ("region echoed sk-proj-ABCDEFGH12345678 back", "sk-proj-ABCDEFGH12345678"),
    ("bearer eyJhbGciOi.eyJzdWIi.sig", "eyJhbGciOi.eyJzdWIi.sig"),
    # redis-py's documented forms: the password as a query parameter, any case.
    ("redis at unix:///tmp/r.sock?db=0&password=Sup3rPw unreachable", "Sup3rPw"),
    ("redis at redis://10.0.0.5/0?PASSWORD=Sup3rPw down", "Sup3rPw"),
    ("base_url https://h/v1?pass=p4ss&x=1", "p4ss"),
    ("base_url https://h/v1?a=1&Pwd=p4ss", "p4ss"),
    ("base_url https://h/v1?token=t0k3n", "t0k3n"),
    ("base_url https://h/v1?x=1;secret=s3cr3t", "s3cr3t"),
]


@pytest.mark.parametrize(("line", "secret"), CASES)
def test_redact_removes_the_secret(line: str, secret: str) -> None:
    out = redact(line)
    assert secret not in out
    assert REDACTED in out


def test_redact_keeps_what_is_not_a_secret() -> None:
    for line in (
        "region a: unhealthy (connect refused)",
        "listening on https://127.0.0.1:8443",
        "redis://10.0.0.5:6379/0 unavailable",
        "request r-1: attempt 1 failed: timeout at http://10.0.0.7:8000",
        "redis at unix:///tmp/r.sock?db=0 unreachable",
        "https://h/v1?passage=1&tokens=2",
    ):
        assert redact(line) == line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("unix:///tmp/r.sock?db=0&password=Sup3rPw", "unix:///tmp/r.sock?db=0&password=[redacted]"),
        ("redis://:Sup3rPw@10.0.0.5:6379/0", "redis://10.0.0.5:6379/0"),
        (
            "rediss://app:Sup3rPw@[::1]:6380/2?Token=Sup3rPw",
            "rediss://[::1]:6380/2?Token=[redacted]",
        ),
        ("https://u:p4ss@h:8443/v1?api=2&pwd=p4ss", "https://h:8443/v1?api=2&pwd=[redacted]"),
        ("http://10.0.0.7:8000/v1", "http://10.0.0.7:8000/v1"),
    ],
)
def test_display_url_shows_where_never_the_credentials(url: str, shown: str) -> None:
    assert display_url(url) == shown


@pytest.fixture
def captured() -> io.StringIO:
    stream = io.StringIO()
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    yield stream
    for handler in [h for h in root.handlers if h not in before[0]]:
        root.removeHandler(handler)
    root.setLevel(before[1])


def test_every_line_and_traceback_is_redacted(captured: io.StringIO) -> None:
    configure("info", "plain", captured)
    log = logging.getLogger("router.test")
    log.warning("cache: redis tier unavailable: %r", "redis://:pw-secret@h:6379")
    try:
        raise ValueError("bad header Authorization: Bearer sk-trace-secret-123")
    except ValueError:
        log.exception("unhandled")
    text = captured.getvalue()
    assert "pw-secret" not in text
    assert "sk-trace-secret-123" not in text
    assert "Traceback" in text  # a real bug keeps its traceback


def test_json_lines(captured: io.StringIO) -> None:
    configure("info", "json", captured)
    logging.getLogger("router").info("config reloaded (generation %d)", 3)
    logging.getLogger("router").debug("not at info")
    lines = captured.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["msg"] == "config reloaded (generation 3)"
    assert record["level"] == "info"
    assert record["logger"] == "router"
    assert isinstance(record["ts"], float)
