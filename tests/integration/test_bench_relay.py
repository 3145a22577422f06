"""bench/relay.py, the floor of bench/overhead: bytes relayed exactly, keep-alive and streams."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import MODEL, SimFactory
from tests.support import Proc, free_port, spawn

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Relay me."}]}


@pytest.fixture
def pair(sim_region: SimFactory, tmp_path: Path) -> Iterator[tuple[Proc, Proc]]:
    sim = sim_region("relay-upstream")
    port = free_port()
    relay = spawn(
        [sys.executable, "-m", "bench.relay", str(port), str(sim.port)], port, tmp_path / "r.log"
    )
    yield sim, relay
    relay.kill()


def _post(conn: http.client.HTTPConnection, stream: bool) -> tuple[int, bytes]:
    payload = json.dumps({**BODY, "stream": stream})
    conn.request("POST", "/v1/chat/completions", payload, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_relay_answers_byte_for_byte_on_one_connection(pair: tuple[Proc, Proc]) -> None:
    sim, relay = pair
    direct = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    relayed = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
    try:
        for stream in (False, True, False, True):
            status, expected = _post(direct, stream)
            assert status == 200
            assert _post(relayed, stream) == (200, expected)
        assert b"data: [DONE]" in expected
    finally:
        direct.close()
        relayed.close()


def test_relay_closes_the_client_when_the_upstream_is_gone(tmp_path: Path) -> None:
    port, dead = free_port(), free_port()
    relay = spawn([sys.executable, "-m", "bench.relay", str(port), str(dead)], port, tmp_path / "r")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            _post(conn, False)
        conn.close()
        assert relay.popen.poll() is None  # still serving
    finally:
        relay.kill()
