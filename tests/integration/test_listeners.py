"""The client and admin listeners as real processes: each serves only its own routes, TLS on
both (certificates from a CA made at test time, the openai SDK verifying them), certificates
reloaded on SIGHUP without dropping a live connection, a client certificate for the admin one."""

from __future__ import annotations

import http.client
import shutil
import signal
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import httpx2 as httpx
import pytest
from openai import OpenAI

from tests.integration.conftest import MODEL, RouterFactory, SimFactory, regions_toml
from tests.integration.tls_certs import Pki, make_pki
from tests.support import Proc, free_port, wait_for_port


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _status(url: str, context: ssl.SSLContext | None = None) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


def _chat(base_url: str, http_client: httpx.Client | None = None) -> str:
    client = OpenAI(base_url=base_url + "/v1", api_key="x", http_client=http_client, max_retries=0)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    return out.choices[0].message.content or ""


def _start(sim_region: SimFactory, router_proc: RouterFactory, server: str) -> tuple[Proc, int]:
    """A router with one sim region and `server` lines in [server], admin on a second port."""
    admin = free_port()
    region = sim_region("a")
    header = f'[server]\nadmin_listen = "127.0.0.1:{admin}"\n{server}\n'
    router = router_proc(regions_toml(region, header=header))
    wait_for_port(admin, proc=router.popen)
    return router, admin


def test_admin_listener_serves_only_operator_routes(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router, admin = _start(sim_region, router_proc, "")
    client, ops = router.url, f"http://127.0.0.1:{admin}"
    for path in ("/metrics", "/status", "/status.json", "/admin/health"):
        assert _status(client + path) == 404, path
    assert _status(ops + "/metrics") == 200
    assert _status(ops + "/status.json") == 200
    assert _status(ops + "/status") == 200
    # Admin routes exist there, behind the admin token.
    assert _status(ops + "/admin/health") == 401
    assert _chat(client)
    with pytest.raises(Exception, match="404"):
        _chat(ops)
    assert _status(ops + "/v1/models") == 404
    for base in (client, ops):
        assert _status(base + "/healthz") == 200


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_openai_sdk_verifies_the_tls_listener(
    pki: Pki, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    tls = f'[server.tls]\ncert_file = "{pki.cert}"\nkey_file = "{pki.key}"\n'
    router, admin = _start(sim_region, router_proc, tls)
    base = f"https://127.0.0.1:{router.port}"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(pki.ca))) as verified:
        assert _chat(base, verified)
    # Unverifiable for a client that does not trust the CA.
    with httpx.Client() as default, pytest.raises(Exception, match=r"(?i)certificate|connection"):
        _chat(base, default)
    # Old protocols are refused at the handshake.
    old = ssl.create_default_context(cafile=str(pki.ca))
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError), socket.create_connection(("127.0.0.1", router.port)) as raw:
        old.wrap_socket(raw, server_hostname="127.0.0.1")
    # The admin listener has no [server.admin_tls]: plain HTTP.
    assert _status(f"http://127.0.0.1:{admin}/metrics") == 200


def test_min_version_1_3_refuses_tls_1_2(
    pki: Pki, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    tls = f'[server.tls]\ncert_file = "{pki.cert}"\nkey_file = "{pki.key}"\nmin_version = "1.3"\n'
    router, _ = _start(sim_region, router_proc, tls)
    for version, accepted in ((ssl.TLSVersion.TLSv1_2, False), (ssl.TLSVersion.TLSv1_3, True)):
        client = ssl.create_default_context(cafile=str(pki.ca))
        client.minimum_version = client.maximum_version = version
        with socket.create_connection(("127.0.0.1", router.port), timeout=5) as raw:
            if accepted:
                with client.wrap_socket(raw, server_hostname="127.0.0.1") as tls_socket:
                    assert tls_socket.version() == "TLSv1.3"
            else:
                with pytest.raises(ssl.SSLError):
                    client.wrap_socket(raw, server_hostname="127.0.0.1")


def _subject_cn(conn: http.client.HTTPSConnection) -> str:
    assert isinstance(conn.sock, ssl.SSLSocket)
    cert = conn.sock.getpeercert()
    assert cert is not None
    return str(dict(pair[0] for pair in cert["subject"])["commonName"])


def _get(conn: http.client.HTTPSConnection, path: str) -> int:
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def test_sighup_reloads_the_certificate_and_keeps_live_connections(
    pki: Pki, sim_region: SimFactory, router_proc: RouterFactory, tmp_path: Path
) -> None:
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki.cert, cert)
    shutil.copy(pki.key, key)
    tls = f'[server.tls]\ncert_file = "{cert}"\nkey_file = "{key}"\n'
    router, _ = _start(sim_region, router_proc, tls)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    before = http.client.HTTPSConnection("127.0.0.1", router.port, context=ctx, timeout=5)
    assert _get(before, "/healthz") == 200
    assert _subject_cn(before) == "server"
    live_socket = before.sock

    new_cert, new_key = pki.reissue("rotated")
    shutil.copy(new_cert, cert)
    shutil.copy(new_key, key)
    router.popen.send_signal(signal.SIGHUP)
    router.wait_output("config reloaded from")

    after = http.client.HTTPSConnection("127.0.0.1", router.port, context=ctx, timeout=5)
    assert _get(after, "/healthz") == 200
    assert _subject_cn(after) == "rotated"
    # The connection opened before the reload still serves, on the same socket and certificate.
    assert _get(before, "/healthz") == 200
    assert before.sock is live_socket
    assert _subject_cn(before) == "server"
    before.close()
    after.close()


def test_a_broken_certificate_on_reload_keeps_the_old_one(
    pki: Pki, sim_region: SimFactory, router_proc: RouterFactory, tmp_path: Path
) -> None:
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki.cert, cert)
    shutil.copy(pki.key, key)
    router, _ = _start(
        sim_region, router_proc, f'[server.tls]\ncert_file = "{cert}"\nkey_file = "{key}"\n'
    )
    cert.write_text("not a certificate\n")
    router.popen.send_signal(signal.SIGHUP)
    out = router.wait_output("config reload rejected")
    assert "server.tls" in out
    conn = http.client.HTTPSConnection(
        "127.0.0.1", router.port, context=ssl.create_default_context(cafile=str(pki.ca)), timeout=5
    )
    assert _get(conn, "/healthz") == 200
    assert _subject_cn(conn) == "server"
    conn.close()


def test_admin_listener_can_require_a_client_certificate(
    pki: Pki, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    tls = (
        f'[server.admin_tls]\ncert_file = "{pki.cert}"\nkey_file = "{pki.key}"\n'
        f'client_ca_file = "{pki.ca}"\n'
    )
    router, admin = _start(sim_region, router_proc, tls)
    url = f"https://127.0.0.1:{admin}/metrics"
    anonymous = ssl.create_default_context(cafile=str(pki.ca))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _status(url, anonymous)
    with_cert = ssl.create_default_context(cafile=str(pki.ca))
    with_cert.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    assert _status(url, with_cert) == 200
    # The client listener is plain HTTP and unaffected.
    assert _chat(router.url)
