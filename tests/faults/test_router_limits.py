"""The limits that protect the router itself: messages per request, header size, requests in
flight per client IP. (Body size, slow-loris and slow-body deadlines are in
tests/integration/test_proxy.py; the region response cap in test_upstream_faults.py.)"""

from __future__ import annotations

import socket
import threading
import time

import requests

from tests.integration.conftest import MODEL, RouterFactory, SimFactory, regions_toml, sim_stats

SERVER = "[server]\nmax_messages = 8\nmax_header_bytes = 4096\nmax_in_flight_per_ip = 2\n"


def _chat(n_messages: int = 1) -> dict[str, object]:
    messages = [{"role": "user", "content": f"m{i}"} for i in range(n_messages)]
    return {"model": MODEL, "messages": messages, "max_tokens": 4}


def test_too_many_messages_is_400(sim_region: SimFactory, router_proc: RouterFactory) -> None:
    sim = sim_region("a")
    router = router_proc(regions_toml(sim, header=SERVER))
    resp = requests.post(router.url + "/v1/chat/completions", json=_chat(9), timeout=10)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "too_many_items"
    assert error["param"] == "messages"
    ok = requests.post(router.url + "/v1/chat/completions", json=_chat(8), timeout=10)
    assert ok.status_code == 200
    assert sim_stats(sim)["requests"] == 1


def test_oversized_header_is_rejected_and_router_keeps_serving(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    sim = sim_region("a")
    router = router_proc(regions_toml(sim, header=SERVER))
    resp = requests.post(
        router.url + "/v1/chat/completions",
        json=_chat(),
        headers={"X-Big": "x" * 8000},
        timeout=10,
    )
    assert resp.status_code in (400, 431)
    with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
        sock.sendall(b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(64).split(b" ")[1] == b"400"
    assert requests.post(router.url + "/v1/chat/completions", json=_chat(), timeout=10).ok
    assert sim_stats(sim)["requests"] == 1


def test_in_flight_per_ip_cap(sim_region: SimFactory, router_proc: RouterFactory) -> None:
    sim = sim_region("a", tokens_per_s=20)
    router = router_proc(regions_toml(sim, header=SERVER))
    url = router.url + "/v1/chat/completions"
    slow = {**_chat(), "max_tokens": 40, "stream": True}
    done: list[int] = []

    def hold() -> None:
        with requests.post(url, json=slow, stream=True, timeout=30) as resp:
            for _ in resp.iter_content(None):
                pass
            done.append(resp.status_code)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for t in holders:
        t.start()
    deadline = time.monotonic() + 10
    while sim_stats(sim)["active"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    resp = requests.post(url, json=_chat(), timeout=10)
    assert resp.status_code == 429
    assert resp.json()["error"]["code"] == "too_many_concurrent_requests"
    assert resp.headers["Retry-After"] == "1"
    for t in holders:
        t.join(timeout=30)
    assert done == [200, 200]
    assert requests.post(url, json=_chat(), timeout=10).status_code == 200
