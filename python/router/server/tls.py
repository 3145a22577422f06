"""TLS on the listeners: modern defaults, certificates re-read in place on reload."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

from router.config import Commit, Config, TlsConfig
from router.errors import ConfigError

log = logging.getLogger("router")

# Mozilla's "intermediate" TLS 1.2 suites (forward secrecy, AEAD only); TLS 1.3 suites are fixed
# by OpenSSL and all modern.
_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
)
_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def server_context(tls: TlsConfig, field: str) -> ssl.SSLContext:
    """A server-side context for `tls`; ConfigError naming `field` when a file will not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[tls.min_version]
    ctx.set_ciphers(_CIPHERS)
    # No compression (CRIME), no renegotiation, a fresh ECDH key per handshake.
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_SINGLE_ECDH_USE
    ctx.set_alpn_protocols(["http/1.1"])
    load(ctx, tls, field)
    return ctx


def load(ctx: ssl.SSLContext, tls: TlsConfig, field: str) -> None:
    """(Re)load the chain, key and client CA into `ctx`; new handshakes use them, live
    connections keep theirs."""
    for path in (tls.cert_file, tls.key_file, tls.client_ca_file):
        if path is not None:
            _readable(path, field)
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"field `{field}`: {tls.cert_file} / {tls.key_file}: not a PEM certificate chain "
            f"and its matching private key ({_reason(exc)})"
        ) from None
    if tls.client_ca_file is None:
        ctx.verify_mode = ssl.CERT_NONE
        return
    try:
        ctx.load_verify_locations(cafile=tls.client_ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"field `{field}.client_ca_file`: cannot load {tls.client_ca_file} ({_reason(exc)})"
        ) from None
    ctx.verify_mode = ssl.CERT_REQUIRED


def _readable(path: str, field: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise ConfigError(f"field `{field}`: cannot read {path}: {reason}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__


class Listeners:
    """The SSL contexts of the client and admin listeners (None: plain HTTP)."""

    __slots__ = ("admin", "client")

    def __init__(self, config: Config) -> None:
        server = config.server
        self.client = server_context(server.tls, "server.tls") if server.tls else None
        self.admin = (
            server_context(server.admin_tls, "server.admin_tls") if server.admin_tls else None
        )

    def preparer(self) -> Callable[[Config, Config], Commit]:
        """On every reload, re-read the certificate files (rotated in place or renamed)."""

        def prepare(old: Config, new: Config) -> Commit:
            steps: list[Callable[[], None]] = []
            for name, ctx, tls in (
                ("tls", self.client, new.server.tls),
                ("admin_tls", self.admin, new.server.admin_tls),
            ):
                if (ctx is None) != (tls is None):
                    log.info(
                        "config reload: server.%s turned on or off; takes effect on restart", name
                    )
                    continue
                if ctx is None or tls is None:
                    continue
                # A throwaway context proves the files load before the live one is touched.
                server_context(tls, f"server.{name}")
                steps.append(_reloading(ctx, tls, f"server.{name}"))

            def commit() -> None:
                for step in steps:
                    step()

            return commit

        return prepare


def _reloading(ctx: ssl.SSLContext, tls: TlsConfig, field: str) -> Callable[[], None]:
    def step() -> None:
        load(ctx, tls, field)

    return step
