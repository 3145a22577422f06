"""What an operator reads: start-up failures as one line and a non-zero exit, malformed
requests as one short line without their bytes, no credentials, no versions, no internal
addresses in what clients see."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tests.integration.conftest import MODEL, RouterFactory, SimFactory, regions_toml
from tests.integration.tls_certs import make_pki
from tests.support import free_port, router_cmd

SECRET = "sk-live-0123456789abcdefSECRET"


def _start_fails(tmp_path: Path, server: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "router.toml"
    path.write_text(
        f"[server]\n{server}\n[auth]\nenabled = false\n[health]\nenabled = false\n"
        f'[[regions]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodels = ["{MODEL}"]\n'
    )
    return subprocess.run(
        router_cmd("serve", "--config", str(path)), capture_output=True, text=True, timeout=30
    )


def _one_line_failure(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("router: ")]
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]


def test_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _start_fails(tmp_path, f'listen = "127.0.0.1:{port}"')
    _one_line_failure(result, f"127.0.0.1:{port}", "address already in use")


def test_bad_certificate_and_unreadable_key_are_one_line(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    listen = f'listen = "127.0.0.1:{free_port()}"'
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    bad = _start_fails(
        tmp_path, f'{listen}\n[server.tls]\ncert_file = "{garbage}"\nkey_file = "{pki.key}"'
    )
    _one_line_failure(bad, "server.tls", str(garbage))
    missing = tmp_path / "nope.key"
    gone = _start_fails(
        tmp_path, f'{listen}\n[server.tls]\ncert_file = "{pki.cert}"\nkey_file = "{missing}"'
    )
    _one_line_failure(gone, "server.tls", str(missing), "no such file")


def test_malformed_request_is_one_short_line_without_its_bytes(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router = router_proc(regions_toml(sim_region("a")))
    raw = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\r\n"
        "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"
    ).encode()
    with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
        sock.sendall(raw)
        answer = sock.recv(65536).decode(errors="replace")
    assert answer.split("\r\n", 1)[0].endswith(" 400 Bad Request"), answer
    assert "Server: router\r\n" in answer, answer
    out = router.wait_output("malformed request from 127.0.0.1")
    assert SECRET not in out
    assert "Traceback" not in out
    line = next(ln for ln in out.splitlines() if "malformed request" in ln)
    assert len(line) < 300, line


def test_client_input_cannot_forge_plain_access_lines(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    header = '[observability]\nlog_format = "plain"\naccess_log_flush_ms = 0\n'
    router = router_proc(regions_toml(sim_region("a"), header=header))
    forged = "1999-01-01T00:00:00 forged-id POST /v1/chat/completions 200 tenant=root"
    # aiohttp decodes %0a in the path; the model name is JSON with a real newline.
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/nope%0a{forged.replace(' ', '%20')} HTTP/1.1\r\nHost: x\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        assert b" 404 " in sock.recv(65536).split(b"\r\n", 1)[0]
    body = json.dumps({"model": "x\n" + forged, "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        router.url + "/v1/chat/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 404
    caught.value.close()
    out = router.wait_output('model="x\\n1999')
    lines = out.splitlines()
    assert not [ln for ln in lines if ln.startswith("1999-")], out
    assert sum("forged-id" in ln for ln in lines) == 2, out
    assert '"/v1/nope\\n1999-01-01T00:00:00 forged-id' in out


def test_no_versions_in_server_and_no_internal_address_for_clients(
    router_proc: RouterFactory,
) -> None:
    dead = free_port()
    router = router_proc(
        "[auth]\nenabled = false\n[health]\nenabled = false\n"
        f'[[regions]]\nname = "a"\nbase_url = "http://127.0.0.1:{dead}/v1"\nmodels = ["{MODEL}"]\n'
    )
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(
        router.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {SECRET}"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    answer = caught.value
    assert answer.code == 502
    message = answer.read().decode()
    assert str(dead) not in message, message
    assert "127.0.0.1" not in message, message
    assert answer.headers["Server"] == "router"
    # The log keeps where it failed, never the key.
    out = router.wait_output(f"127.0.0.1:{dead}")
    assert SECRET not in out
    with urllib.request.urlopen(router.url + "/healthz", timeout=5) as ok:
        assert ok.headers["Server"] == "router"


def test_ops_logs_are_json_lines_when_asked(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    header = '[observability]\nlog_format = "json"\naccess_log = false\n'
    router = router_proc(regions_toml(sim_region("a"), header=header))
    out = router.wait_output("router listening on")
    line = next(ln for ln in out.splitlines() if "router listening on" in ln)
    record = json.loads(line)
    assert record["level"] == "info"
    assert record["logger"] == "router"


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2-pw@127.0.0.1:{dead}/0",
        # redis-py's documented query form, for a TCP server and a Unix socket.
        "redis://127.0.0.1:{dead}/0?password=hunter2-pw",
        "unix://{tmp}/gone.sock?db=0&password=hunter2-pw",
    ],
)
def test_a_redis_password_never_reaches_the_log(
    sim_region: SimFactory, router_proc: RouterFactory, tmp_path: Path, url: str
) -> None:
    from router.access.auth import hash_key

    dead = free_port()
    redis_url = url.format(dead=dead, tmp=tmp_path)
    header = (
        f'[limits]\nbackend = "redis"\nredis_url = "{redis_url}"\n'
        f'[auth]\n[[auth.keys]]\nsha256 = "{hash_key(SECRET)}"\ntenant = "t"\n'
        "requests_per_minute = 100\n"
    )
    router = router_proc(regions_toml(sim_region("a"), header=header))
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(
        router.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {SECRET}"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200  # fail-open: local limits while Redis is out
    out = router.wait_output("global limits: redis at")
    line = next(ln for ln in out.splitlines() if "global limits: redis at" in ln)
    # Where it failed stays in the line; the password never does.
    assert (f"127.0.0.1:{dead}/0" if "{dead}" in url else f"{tmp_path}/gone.sock") in line
    assert "hunter2-pw" not in out
    assert SECRET not in out


async def test_admin_health_shows_region_urls_without_credentials() -> None:
    from aiohttp.test_utils import TestServer

    from router.access.auth import hash_key
    from router.config import loads
    from router.errors import ConfigError
    from router.server.app import build_app

    admin = "admin-ops-0123456789abcdef"
    text = (
        f'[auth]\nadmin_token_sha256 = "{hash_key(admin)}"\n[health]\nenabled = false\n'
        '[[regions]]\nname = "a"\n'
        f'base_url = "http://127.0.0.1:{free_port()}/v1?token=tok-secret&v=2"\n'
        f'models = ["{MODEL}"]\n'
    )
    # A URL with user:pass@ is refused at start, and the refusal does not quote the password.
    with pytest.raises(ConfigError) as refused:
        build_app(loads(text.replace("http://", "http://app:hunter2-pw@"), "ops.toml"))
    assert "hunter2-pw" not in str(refused.value)
    server = TestServer(build_app(loads(text, "ops.toml")), host="127.0.0.1")
    await server.start_server()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                server.make_url("/admin/health"), headers={"Authorization": f"Bearer {admin}"}
            ) as resp,
        ):
            assert resp.status == 200
            shown = await resp.text()
    finally:
        await server.close()
    (region,) = json.loads(shown)["regions"]
    assert "tok-secret" not in shown
    assert region["url"].startswith("http://127.0.0.1:")
    assert "token=[redacted]&v=2" in region["url"]
