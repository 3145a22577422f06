"""Environment overrides for what differs per host: `ROUTER_<SECTION>_<FIELD>` replaces that
field of the config file (listen addresses, TLS files, Redis URLs, the admin token hash)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENV_PREFIX = "ROUTER_"

# (section..., field) that may come from the environment; values are strings unless listed in
# _INTEGER (a number, or the word the field also accepts).
OVERRIDABLE: tuple[tuple[str, ...], ...] = (
    ("server", "listen"),
    ("server", "admin_listen"),
    ("server", "workers"),
    ("server", "tls", "cert_file"),
    ("server", "tls", "key_file"),
    ("server", "admin_tls", "cert_file"),
    ("server", "admin_tls", "key_file"),
    ("server", "admin_tls", "client_ca_file"),
    ("auth", "admin_token_sha256"),
    ("limits", "redis_url"),
    ("cache", "redis_url"),
    ("state", "redis_url"),
    ("observability", "log_level"),
    ("observability", "log_format"),
    ("observability", "otlp_endpoint"),
)
_INTEGER = frozenset({("server", "workers")})


def env_name(*path: str) -> str:
    """`("server", "admin_listen")` -> `ROUTER_SERVER_ADMIN_LISTEN`."""
    return ENV_PREFIX + "_".join(path).upper()


def apply(raw: dict[str, Any], env: Mapping[str, str]) -> list[tuple[str, str]]:
    """Set each overridden field in the decoded TOML `raw`, in place; (variable, field) applied.
    An empty variable raises ValueError naming it (unset it to keep the file's value)."""
    applied = []
    for path in OVERRIDABLE:
        name = env_name(*path)
        value = env.get(name)
        if value is None:
            continue
        if not value.strip():
            raise ValueError(f"{name} is set but empty; unset it to use the config file's value")
        table = raw
        for part in path[:-1]:
            nested = table.setdefault(part, {})
            if not isinstance(nested, dict):
                raise ValueError(f"{name}: `{part}` in the config file is not a table")
            table = nested
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
        number = value.isascii() and value.isdigit()
        table[path[-1]] = int(value) if path in _INTEGER and number else value
        applied.append((name, ".".join(path)))
    return applied
