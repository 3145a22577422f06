"""Clients that misbehave at every stage of a request: the router cancels upstream work, frees
what it held, and keeps serving everyone else."""

from __future__ import annotations

import hashlib
import json
import socket
import time

import pytest
import requests

from tests.integration.conftest import (
    MODEL,
    RouterFactory,
    SimFactory,
    regions_toml,
    sim_stats,
)
from tests.support import Proc

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "tell me a story"}]}


def _raw(router: Proc, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", router.port), timeout=5)
    sock.sendall(data)
    return sock


def _request_bytes(
    body: bytes, headers: dict[str, str] | None = None, path: str = "/v1/chat/completions"
) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _wait_idle(sim: Proc, timeout: float = 10.0) -> dict[str, int]:
    """Poll until the sim has no request in progress; return its counters."""
    deadline = time.monotonic() + timeout
    while True:
        stats = sim_stats(sim)
        if stats["active"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def _serves(router: Proc) -> None:
    resp = requests.post(
        router.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, timeout=10
    )
    assert resp.status_code == 200, resp.text[:300]


def test_disconnect_during_request_head_and_body(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    sim = sim_region("a")
    router = router_proc(regions_toml(sim))
    body = json.dumps(CHAT).encode()
    for cut in (b"POST /v1/chat/compl", _request_bytes(body)[: -len(body) // 2]):
        sock = _raw(router, cut)
        sock.close()
    _serves(router)
    # Nothing half-received was forwarded: only the one good request reached the region.
    assert sim_stats(sim)["requests"] == 1


def test_disconnect_before_first_byte_cancels_upstream(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    sim = sim_region("a")
    router = router_proc(regions_toml(sim))
    body = json.dumps(CHAT).encode()
    sock = _raw(router, _request_bytes(body, {"x-sim-fail": "hang", "x-sim-after-tokens": "0"}))
    deadline = time.monotonic() + 10
    while sim_stats(sim)["active"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sim_stats(sim)["active"] == 1
    sock.close()
    stats = _wait_idle(sim)
    assert stats["active"] == 0
    assert stats["cancelled"] == 1
    _serves(router)


STREAMS = {
    "/v1/chat/completions": {**CHAT, "stream": True, "max_tokens": 400},
    "/v1/responses": {
        "model": MODEL,
        "input": "tell me a story",
        "stream": True,
        "store": False,
        "max_output_tokens": 400,
    },
    "/v1/messages": {**CHAT, "stream": True, "max_tokens": 400},
}


@pytest.mark.parametrize("path", list(STREAMS))
def test_disconnect_mid_stream_cancels_upstream(
    path: str, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    sim = sim_region("a", tokens_per_s=20)
    router = router_proc(regions_toml(sim))
    body = json.dumps(STREAMS[path]).encode()
    sock = _raw(router, _request_bytes(body, path=path))
    received = b""
    # Past the opening events: three text deltas (every API's token events say "delta").
    while received.count(b'"delta"') < 3:
        received += sock.recv(4096)
    sock.close()
    stats = _wait_idle(sim)
    assert stats["cancelled"] == 1
    assert stats["tokens_sent"] < 400
    _serves(router)


def test_client_that_never_reads_does_not_block_others(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    sim = sim_region("a")
    router = router_proc(regions_toml(sim))
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 2000}).encode()
    # A tiny receive buffer that is never read: the router's writes back up on this one client.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", router.port))
    sock.sendall(_request_bytes(body))
    try:
        for _ in range(5):
            _serves(router)
    finally:
        sock.close()
    _wait_idle(sim)
    _serves(router)


def _answers(sock: socket.socket, whole: bool = True) -> bytes:
    """Everything the router sends until it closes the connection (or 5 s pass); with not
    `whole`, only until the end of its first answer's body (Content-Length)."""
    out = b""
    sock.settimeout(5)
    with sock:
        try:
            while chunk := sock.recv(65536):
                out += chunk
                head, sep, body = out.partition(b"\r\n\r\n")
                length = [
                    int(line.split(b":")[1]) for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]  # fmt: skip
                if not whole and sep and length and len(body) >= length[0]:
                    break
        except TimeoutError:
            out += b"<still open>"
    return out


def test_a_body_that_does_not_decode_is_a_400_and_the_connection_closes(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    sim = sim_region("a")
    admin = "admin-token-0123456789abcdef"
    digest = hashlib.sha256(admin.encode()).hexdigest()
    header = f'[auth]\nenabled = false\nadmin_token_sha256 = "{digest}"\n'
    router = router_proc(regions_toml(sim, header=header))
    body = json.dumps(CHAT).encode()
    after = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for path, extra in (
        ("/v1/chat/completions", {}),
        # An operator route reads its body through aiohttp too.
        ("/admin/rollout/weights", {"Authorization": f"Bearer {admin}"}),
    ):
        headers = {"Content-Encoding": "gzip", **extra}
        answer = _answers(_raw(router, _request_bytes(body, headers, path) + after))
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), answer[:300]
        assert b"Connection: close" in head
        assert json.loads(rest)["error"]["code"] == "invalid_body"
        # The parser stopped at the body: nothing after it is answered.
        assert b"/healthz" not in answer
        assert answer.count(b"HTTP/1.1") == 1
    # An empty body is what it is, not a body cut short.
    answer = _answers(_raw(router, _request_bytes(b"", {"Connection": "close"})))
    assert b"Request body is empty" in answer
    _serves(router)
    assert "Traceback" not in router.output()
    assert sim_stats(sim)["requests"] == 1


def test_what_aiohttp_answers_itself_is_in_openais_shape(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    sim = sim_region("a")
    router = router_proc(regions_toml(sim))
    body = json.dumps(CHAT).encode()
    cases = [
        # Request smuggling's shapes, folded headers, a header past the bound: the parser's.
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
         b"Content-Length: 6\r\n\r\nhello", 400, "invalid_http"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n",
         400, "invalid_http"),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
         400, "invalid_http"),
        (_request_bytes(body, {"Expect": "bogus"}), 417, "expectation_failed"),
        # Every route, not only the proxied ones.
        (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nExpect: foo\r\n\r\n", 417,
         "expectation_failed"),
        # 100-continue for a body over max_body_bytes: its 413 at once, never a 100 first.
        (_request_bytes(b"", {"Expect": "100-continue"}).replace(
            b"Content-Length: 0", b"Content-Length: 99999999"), 413, "request_too_large"),
    ]  # fmt: skip
    for raw, status, code in cases:
        # The 413's connection stays open a while for the body the client promised (aiohttp's
        # lingering close, so the answer is not lost to a reset): its answer is enough.
        answer = _answers(_raw(router, raw), whole=status != 413)
        assert b"100 Continue" not in answer
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == str(status).encode(), answer[:300]
        assert b"application/json" in head
        error = json.loads(rest)["error"]
        assert (error["code"], error["type"]) == (code, "invalid_request_error")
        # The client's own bytes are never echoed back.
        assert b"hello" not in rest
        assert b"folded" not in rest
    # 100-continue for a body that fits still works.
    answer = _answers(_raw(router, _request_bytes(body, {"Expect": "100-continue"})))
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    _serves(router)
    output = router.output()
    assert "Traceback" not in output
    assert "malformed request from 127.0.0.1" in output  # one short line each


def _status_lines(answer: bytes) -> int:
    """How many answers `answer` holds (a status line each)."""
    return answer.count(b"HTTP/1.0 ") + answer.count(b"HTTP/1.1 ")


def _chunked_head(path: str, headers: dict[str, str] | None = None) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        "Transfer-Encoding: chunked",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode()


def test_chunk_framing_that_breaks_mid_body_is_a_400_at_once_and_the_connection_closes(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    sim = sim_region("a")
    admin = "admin-token-0123456789abcdef"
    digest = hashlib.sha256(admin.encode()).hexdigest()
    # A body deadline the 5 s read bound in _answers cannot reach: only a 400 sent as soon as
    # the bad framing arrives is seen (the handler waiting for the rest of its body is not).
    header = (
        "[server]\nbody_timeout_s = 30.0\n"
        f'[auth]\nenabled = false\nadmin_token_sha256 = "{digest}"\n'
    )
    router = router_proc(regions_toml(sim, header=header))
    body = json.dumps(CHAT).encode()
    first = b"%x\r\n%s\r\n" % (10, body[:10])
    after = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for path, extra in (
        ("/v1/chat/completions", {}),
        # An operator route reads its body through aiohttp too.
        ("/admin/rollout/weights", {"Authorization": f"Bearer {admin}"}),
    ):
        # The head and a good first chunk, then (once the handler reads the body) a chunk size
        # that is not hex, and a request behind it.
        sock = _raw(router, _chunked_head(path, extra) + first)
        time.sleep(0.3)
        sock.sendall(b"zz\r\n" + after)
        answer = _answers(sock)
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), answer[:300]
        assert b"Connection: close" in head
        assert json.loads(rest)["error"]["code"] == "invalid_body"
        # One answer, then the close: not the parser's own 400 after it, nor /healthz's.
        assert _status_lines(answer) == 1
        assert b"<still open>" not in answer
    # Bad framing that comes with the head (before any handler runs) is the parser's 400, as
    # before.
    answer = _answers(_raw(router, _chunked_head("/v1/chat/completions") + first + b"zz\r\n"))
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 "), answer[:300]
    assert json.loads(rest)["error"]["code"] == "invalid_http"
    assert _status_lines(answer) == 1
    _serves(router)
    assert "Traceback" not in router.output()
    assert sim_stats(sim)["requests"] == 1


# What curl --http2 sends over plain HTTP: an offer to switch to HTTP/2 (h2c).
UPGRADE = {"Upgrade": "h2c", "Connection": "Upgrade", "HTTP2-Settings": "AAMAAABkAAQAoAAAAAIAAAAA"}
HEALTHZ = (
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Upgrade: h2c\r\nConnection: Upgrade\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
)


@pytest.mark.parametrize(
    ("request_", "forwarded"),
    [
        (_request_bytes(json.dumps({**CHAT, "max_tokens": 4}).encode(), UPGRADE), 1),
        (HEALTHZ, 0),
    ],
    ids=["chat", "healthz"],
)
def test_a_request_asking_to_upgrade_is_served_and_its_answer_closes_the_connection(
    request_: bytes, forwarded: int, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    """aiohttp's parser drops what came after a request asking for an upgrade it does not do:
    a request pipelined behind it must see the connection close (and be sent again), never
    wait for an answer that does not come."""
    sim = sim_region("a")
    router = router_proc(regions_toml(sim))
    pipelined = b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    answer = _answers(_raw(router, request_ + pipelined))
    head, _, rest = answer.partition(b"\r\n\r\n")
    # The request itself is served as if it had not asked; then the connection closes.
    assert head.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert b"<still open>" not in answer
    assert b"Connection: close" in head
    assert _status_lines(answer) == 1
    served = json.loads(rest)
    if forwarded:
        assert served["object"] == "chat.completion"
    else:
        assert served == {"status": "ok"}
    assert sim_stats(sim)["requests"] == forwarded
    _serves(router)
    assert "Traceback" not in router.output()
