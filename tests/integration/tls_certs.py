"""A throwaway CA, server and client certificates made with `openssl` at test time."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    """Paths of a CA and what it signed (server for 127.0.0.1, one client)."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    directory: Path

    def reissue(self, name: str) -> tuple[Path, Path]:
        """A second server certificate for 127.0.0.1 with subject CN=`name`."""
        return _issue(self.directory, name, self.ca, self.directory / "ca.key", server=True)


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _issue(d: Path, name: str, ca: Path, ca_key: Path, *, server: bool) -> tuple[Path, Path]:
    key, csr, cert = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem"
    _run(
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        f"/CN={name}",
        cwd=d,
    )
    ext = d / f"{name}.ext"
    usage = "serverAuth" if server else "clientAuth"
    san = "subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else ""
    ext.write_text(f"{san}extendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n")
    _run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        str(cert),
        "-extfile",
        str(ext),
        cwd=d,
    )
    return cert, key


def make_pki(d: Path) -> Pki:
    """A CA plus a server certificate for 127.0.0.1 and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (make system-deps installs it)")
    ca, ca_key = d / "ca.pem", d / "ca.key"
    _run(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        "/CN=router test CA",
        cwd=d,
    )
    cert, key = _issue(d, "server", ca, ca_key, server=True)
    client_cert, client_key = _issue(d, "client", ca, ca_key, server=False)
    return Pki(ca, cert, key, client_cert, client_key, d)
