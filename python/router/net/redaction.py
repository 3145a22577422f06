"""Credentials out of text an operator or client reads: log lines, and URLs shown in the log
or the admin API (a Redis or region URL may carry a password)."""

from __future__ import annotations

import re

# What a line must never carry: a password in a URL (user:pass@ or a query parameter such as
# redis-py's `?password=`), an Authorization / x-api-key value (as a header line, a dict entry
# or a bare bearer token), an OpenAI-style secret key anywhere.
_URL_PASSWORD = re.compile(r"(?P<keep>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'\"]*:)[^\s@/'\"]+@")
_QUERY_SECRET = re.compile(
    r"(?P<keep>[?&;](?:password|pass|pwd|token|secret)=)[^&#;\s'\"]+", re.IGNORECASE
)
_HEADER_VALUE = re.compile(
    r"(?P<keep>\b(?:authorization|x-api-key|api-key|proxy-authorization)['\"]?\s*[:=]\s*['\"]?)"
    r"(?:(?:bearer|basic)\s+)?[^\s'\",}\\]+",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
_SECRET_KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")
REDACTED = "[redacted]"


def redact(text: str) -> str:
    """`text` with credentials replaced by [redacted]."""
    if "://" in text:
        text = _URL_PASSWORD.sub(rf"\g<keep>{REDACTED}@", text)
    if "=" in text:
        text = _QUERY_SECRET.sub(rf"\g<keep>{REDACTED}", text)
    text = _HEADER_VALUE.sub(rf"\g<keep>{REDACTED}", text)
    text = _BEARER.sub(rf"\g<keep>{REDACTED}", text)
    return _SECRET_KEY.sub(REDACTED, text)


def display_url(url: str) -> str:
    """`url` as the log and the admin API show it: no `user:pass@`, and the values of
    credential query parameters (`password=`, `pass=`, `pwd=`, `token=`, `secret=`) redacted."""
    scheme, sep, rest = url.partition("://")
    if sep:
        end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
        rest = rest[:end].rpartition("@")[2] + rest[end:]
    return _QUERY_SECRET.sub(rf"\g<keep>{REDACTED}", scheme + sep + rest)
