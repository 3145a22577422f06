"""Redis URLs in config: what connects as written passes, anything else is named, no secret."""

from __future__ import annotations

import pytest

from router.config_redis import problem


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://localhost",
        "REDIS://localhost:6379",
        "rediss://:pw@cache.internal:6380/2",
        "redis://user:p%40ss@[::1]:6379",
        "redis://[::1]/3",
        "redis://h:6379/0?socket_timeout=1",
        "unix:///run/redis.sock",
        "unix://:pw@/run/redis.sock?db=1",
    ],
)
def test_urls_that_connect_pass(url: str) -> None:
    assert problem(url) is None


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:6379/0", "got scheme 'http'"),
        ("127.0.0.1:6379", "got no scheme"),
        ("redis://:pw@127.0.0.1:notaport/0", "port from 1 to 65535"),
        ("redis://:pw@127.0.0.1:99999/0", "port from 1 to 65535"),
        ("redis://h:0", "port from 1 to 65535"),
        ("redis://h:\u00b2", "port from 1 to 65535"),
        ("redis://h:", "port from 1 to 65535"),
        ("redis://[::1]:x/0", "port from 1 to 65535"),
        ("redis://:pw@/0", "expected a host after redis://"),
        ("rediss://", "expected a host after rediss://"),
        ("redis://h:6379/zero", "database number after the host"),
        # A password with '/', '#' or '?' cuts the URL early: none of it is quoted back.
        ("redis://default:pw/etXYZ@redis.internal:6379/0", "percent-encoded"),
        ("redis://default:pw#et@host:6379/0", "percent-encoded"),
        ("redis://:pw?x@host:6379/0", "expected a host"),
        ("redis://[::1/0", "Invalid IPv6 URL"),
        ("unix://", "socket path"),
        ("unix://host/run/redis.sock", "socket path"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, expected: str) -> None:
    found = problem(url)
    assert found is not None
    assert expected in found
    assert "pw" not in found
