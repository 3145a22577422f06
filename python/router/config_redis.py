"""Redis URLs in config, checked at load so a bad one fails `check-config`, not `serve`.

The rules are the ones the Redis client applies when it connects (redis.connection.parse_url),
made strict where it would fail late or guess: a port must be a number from 1 to 65535, a
redis:// or rediss:// URL must name a host, a unix:// URL a socket path, and a database number
after the host must be a number (the client would silently use database 0). Messages never
repeat the URL: it may hold a password.
"""

from __future__ import annotations

from urllib.parse import urlsplit

SCHEMES = ("redis", "rediss", "unix")
FORM = "redis://[user:password@]host[:port][/db], rediss://... or unix:///path/to/socket"


def problem(url: str) -> str | None:
    """What is wrong with the Redis URL `url`, or None when it will connect as written."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        shown = f"scheme {scheme!r}" if sep else "no scheme"
        return f"expected {FORM}, got {shown}"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        return f"expected {FORM} ({exc})"
    # What follows the credentials: host and port, or nothing for a unix socket.
    host_port = parts.netloc.rpartition("@")[2]
    if scheme.lower() == "unix":
        if host_port or parts.path in ("", "/"):
            return f"expected a socket path, as in unix:///run/redis.sock; {FORM}"
        return None
    if not parts.hostname:
        return f"expected a host after {scheme}://; {FORM}"
    port = host_port.rpartition("]")[2] if host_port.startswith("[") else host_port
    _, colon, port_text = port.rpartition(":")
    # Neither is quoted back: a password holding '/', '#' or '?' ends the URL's userinfo early,
    # and a piece of it is then read as the port or the database.
    if colon and not (port_text.isascii() and port_text.isdigit() and 1 <= int(port_text) <= 65535):
        return (
            "expected a port from 1 to 65535 (a password holding '/', '#' or '?' must be "
            "percent-encoded)"
        )
    db = parts.path.strip("/")
    if db and not (db.isascii() and db.isdigit()):
        return "expected a database number after the host"
    return None
