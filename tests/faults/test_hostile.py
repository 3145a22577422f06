"""Hostile regions and hostile clients (issue 24): each hole the attack run found, closed.

The hostile region is tests/faults/bad_upstream.py in one of its hostile modes, a real process
on 127.0.0.1; the router is a real `router serve`. Each test names the item it covers.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from tests.faults.conftest import BadFactory
from tests.integration.conftest import MODEL, RouterFactory, SimFactory, region_toml, sim_stats
from tests.support import Proc

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
TIMEOUTS = "[timeouts]\nconnect = 1.0\nfirst_byte = 3.0\nidle = 3.0\ntotal = 10.0\n"


def _router(
    router_proc: RouterFactory, *regions: Proc, extra: str = "", env: dict[str, str] | None = None
) -> Proc:
    body = "".join(
        region_toml(proc, bias_ms=float(10 * i), api_key_env="REGION_KEY")
        for i, proc in enumerate(regions)
    )
    return router_proc(TIMEOUTS + extra + "[auth]\nenabled = false\n" + body, env=env)


def _post(router: Proc, payload: dict[str, Any], **kw: Any) -> requests.Response:
    return requests.post(router.url + "/v1/chat/completions", json=payload, timeout=30, **kw)


@pytest.mark.parametrize("mode", ["hugeheaders", "manyheaders"])
def test_item_1_unbounded_region_headers_fail_the_attempt(
    mode: str, bad_upstream: BadFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    bad = bad_upstream(mode)
    router = _router(router_proc, bad, sim_region("good"))
    resp = _post(router, CHAT)
    assert resp.status_code == 200
    assert resp.headers["x-router-region"] == "good"
    assert "X-Big" not in resp.headers
    assert "X-5" not in resp.headers
    # The router's own memory did not take the 64 MiB: it is still serving at once.
    assert _post(router, CHAT).status_code == 200


def test_item_6_a_never_ending_line_is_cut_at_the_event_bound(
    bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    router = _router(router_proc, bad_upstream("longline"))
    resp = _post(router, {**CHAT, "stream": True})
    events = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "Hello"
    assert json.loads(events[-1])["error"]["code"] == "upstream_stream_error"
    assert len(resp.content) < 64 * 1024  # the 8 MiB line never reached the client


def test_item_7_a_redirect_is_never_relayed(
    bad_upstream: BadFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router = _router(router_proc, bad_upstream("redirect"), sim_region("good"))
    resp = _post(router, CHAT, allow_redirects=False)
    assert resp.status_code == 200
    assert "Location" not in resp.headers
    assert resp.headers["x-router-region"] == "good"


def test_item_8_a_compressed_request_body_reaches_the_region_as_what_it_is(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    import gzip

    region = sim_region("a")
    router = _router(router_proc, region)
    raw = gzip.compress(json.dumps(CHAT).encode())
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    resp = requests.post(router.url + "/v1/chat/completions", data=raw, headers=headers, timeout=10)
    assert resp.status_code == 200
    seen = {k.lower() for k in sim_stats(region)["last_headers"]}
    assert "content-encoding" not in seen


def test_item_12_forwarding_headers_and_connection_named_headers_stay_here(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    region = sim_region("a")
    router = _router(router_proc, region)
    headers = {
        "Cookie": "session=abc",
        "X-Forwarded-For": "10.9.8.7",
        "Forwarded": "for=10.9.8.7",
        "X-Real-IP": "10.9.8.7",
        "Connection": "keep-alive, X-Private",
        "X-Private": "hop only",
        "X-Kept": "yes",
    }
    assert _post(router, CHAT, headers=headers).status_code == 200
    seen = {k.lower(): v for k, v in sim_stats(region)["last_headers"].items()}
    for name in ("cookie", "x-forwarded-for", "forwarded", "x-real-ip", "x-private"):
        assert name not in seen, name
    assert seen["x-kept"] == "yes"


def test_item_14_region_cookies_cors_and_false_encodings_never_reach_clients(
    bad_upstream: BadFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    router = _router(router_proc, bad_upstream("cookies"), sim_region("good"))
    resp = _post(router, CHAT)
    assert resp.status_code == 200
    # A body that claims gzip and is not: a failed attempt, answered by the next region.
    assert resp.headers["x-router-region"] == "good"
    for name in ("Set-Cookie", "Access-Control-Allow-Origin", "Content-Encoding"):
        assert name not in resp.headers, name


def test_item_15_a_region_echoing_its_key_never_shows_it_to_clients(
    bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    secret = "sk-region-secret-0123456789"
    router = _router(router_proc, bad_upstream("echo"), env={"REGION_KEY": secret})
    resp = _post(router, CHAT)
    assert resp.status_code == 500
    assert "Bearer ***" in resp.text  # the echoed header is there, the key is not
    assert secret not in resp.text


def test_item_15_a_stored_response_read_back_never_shows_the_key_or_false_encodings(
    bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    """GET /v1/responses/{id} at the region holding it: an error echoing the router's key for
    the region is relayed with the key blanked; a body in an encoding it was not asked for is a
    clean 502 (docs/APIS.md)."""
    secret = "sk-region-secret-0123456789"
    router = _router(router_proc, bad_upstream("stored"), env={"REGION_KEY": secret})
    for name in ("echo", "gzip", "redirect", "refused"):
        made = requests.post(
            router.url + "/v1/responses", json={"model": MODEL, "input": name}, timeout=30
        )
        assert made.json()["id"] == f"resp_{name}"
    echoed = requests.get(router.url + "/v1/responses/resp_echo", timeout=30)
    assert echoed.status_code == 500
    assert "Bearer ***" in echoed.text  # the echoed header is there, the key is not
    assert secret not in echoed.text
    encoded = requests.get(router.url + "/v1/responses/resp_gzip", timeout=30)
    assert encoded.status_code == 502
    assert encoded.json()["error"]["code"] == "upstream_error"
    assert "Content-Encoding" not in encoded.headers
    # A redirect (it would send the client elsewhere) and a refusal of the router's own key
    # (not the client's) are never relayed: the attempt path's rules.
    for name in ("redirect", "refused"):
        read = requests.get(
            router.url + f"/v1/responses/resp_{name}", timeout=30, allow_redirects=False
        )
        assert read.status_code == 502, name
        assert read.json()["error"]["code"] == "upstream_error"
        assert "Location" not in read.headers


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 5000.0), ("max_tokens", "5000"), ("max_completion_tokens", 5e3)],
)
def test_item_2_token_limits_read_numbers_however_they_are_written(
    field: str, value: object, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    import hashlib

    key = "sk-tenant-0123456789"
    auth = (
        "[auth]\n[[auth.keys]]\n"
        f'sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n'
        'tenant = "t"\ntokens_per_minute = 3000\n'
    )
    router = router_proc(TIMEOUTS + auth + region_toml(sim_region("a")))
    body = {k: v for k, v in CHAT.items() if k != "max_tokens"}
    body[field] = value
    resp = _post(router, body, headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 429
    assert resp.json()["error"]["code"] == "request_too_large"
    bad = {**CHAT, "max_tokens": "many"}
    refused = _post(router, bad, headers={"Authorization": f"Bearer {key}"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "max_tokens"


def test_item_8_a_compressed_body_is_held_to_the_size_limit_once_decoded(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    import gzip

    router = _router(router_proc, sim_region("a"))
    padding = " " * (4 << 20)  # 4 MiB of JSON whitespace, about 4 KiB compressed
    raw = gzip.compress((json.dumps(CHAT)[:-1] + padding + "}").encode())
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    resp = requests.post(router.url + "/v1/chat/completions", data=raw, headers=headers, timeout=10)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


def test_item_16_headers_that_are_not_a_regions_to_send_never_reach_clients(
    bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    """The operator's identity at the provider, the provider account's rate limits, the
    router's own names, policies for the router's origin, the router's key for the region in
    a header name (in any case); values go out as the bytes the region sent, or not at all."""
    secret = "sk-region-secret-0123456789"
    router = _router(router_proc, bad_upstream("spoof"), env={"REGION_KEY": secret})
    resp = _post(router, CHAT)
    assert resp.status_code == 200, resp.text[:300]
    names = {name.lower() for name in resp.headers}
    dropped = (
        "x-hop",
        "openai-organization",
        "openai-project",
        "anthropic-organization-id",
        "x-router-hedged",
        "x-cache",
        "age",
        "strict-transport-security",
        "alt-svc",
        "clear-site-data",
        "www-authenticate",
        "location",
        "content-location",
        "refresh",
        "via",
        "x-powered-by",
        "x-key-value",
        "x-latin",  # latin-1, not UTF-8: not to be sent as it came, so not at all
        # A shared cache in front of the router must not keep one tenant's answer for another.
        "cdn-cache-control",
        "surrogate-control",
        "x-accel-expires",
        "expires",
        "pragma",
        "etag",
        "last-modified",
        "vary",
        "set-cookie",
    )
    assert not names & set(dropped), names & set(dropped)
    assert resp.headers["Cache-Control"] == "no-store"
    # The key has no limits here: the router sets no x-ratelimit-*, and none of the region's.
    assert not [n for n in names if n.startswith(("x-ratelimit", "ratelimit", "anthropic-"))]
    assert not [n for n in names if "secret" in n]
    assert secret not in str(resp.headers)
    # The router's own names say what the router says.
    assert resp.headers["x-router-region"] == "bad-spoof"
    assert resp.headers["X-Request-Id"] != "region-id"
    assert "region;dur" not in resp.headers.get("Server-Timing", "")
    # Byte for byte (http.client reads header bytes as latin-1).
    assert resp.headers["X-Utf8"].encode("latin-1") == "café".encode()
    assert resp.headers["X-Kept"] == "yes"


@pytest.mark.parametrize("stream", [False, True])
def test_item_17_a_region_error_page_becomes_the_routers_own_error(
    stream: bool, bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    """Every region failed with a load balancer's HTML page: the client gets the router's own
    error in the API's shape, with the page's status class, never its text or headers."""
    router = _router(router_proc, bad_upstream("lb502"))
    resp = _post(router, {**CHAT, "stream": stream})
    assert resp.status_code == 502
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.json()["error"]["code"] == "upstream_error"
    for word in ("vllm-node-7", "10.3.4.5", "nginx", "html"):
        assert word not in resp.text.lower(), word
    assert "X-Upstream-Host" not in resp.headers
    anthropic = _messages(router)
    assert anthropic.status_code == 502
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "api_error"
    assert "nginx" not in anthropic.text


def _messages(router: Proc) -> requests.Response:
    """One Anthropic Messages request through the router."""
    return requests.post(
        router.url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"anthropic-version": "2023-06-01"},
        timeout=30,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_item_17_a_regions_own_html_404_becomes_the_routers_own_error(
    stream: bool, bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    """A 404 is no failure (the region's answer, tried nowhere else), but an ingress's HTML
    page naming its hosts is not relayed: the router's own error in the API's shape, with its
    status, never the page's text or headers."""
    router = _router(router_proc, bad_upstream("lb404"))
    resp = _post(router, {**CHAT, "stream": stream})
    assert resp.status_code == 404
    assert resp.headers["Content-Type"] == "application/json"
    error = resp.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "upstream_refused")
    for word in ("vllm-node-7", "10.3.4.5", "nginx", "html"):
        assert word not in resp.text.lower(), word
    assert "X-Upstream-Host" not in resp.headers
    assert resp.headers["x-router-attempts"] == "1"
    anthropic = _messages(router)
    assert anthropic.status_code == 404
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "not_found_error"
    assert "nginx" not in anthropic.text


def test_item_17_a_region_429_page_keeps_its_status_and_retry_after(
    bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    router = _router(router_proc, bad_upstream("lb429"))
    resp = _post(router, CHAT)
    assert resp.status_code == 429
    assert resp.headers["Retry-After"] == "30"
    error = resp.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "upstream_rate_limited")
    assert "nginx" not in resp.text
    assert "X-Upstream-Host" not in resp.headers


def test_item_17_vllms_flat_error_object_is_relayed_in_openais_shape(
    bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    router = _router(router_proc, bad_upstream("flat503"))
    resp = _post(router, CHAT)
    assert resp.status_code == 503
    assert resp.json() == {
        "error": {
            "message": "The engine is overloaded.",
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
    }


def test_item_17_a_stored_response_read_back_as_an_error_page_is_the_routers_own_error(
    bad_upstream: BadFactory, router_proc: RouterFactory
) -> None:
    router = _router(router_proc, bad_upstream("stored"))
    made = requests.post(
        router.url + "/v1/responses", json={"model": MODEL, "input": "page"}, timeout=30
    )
    assert made.json()["id"] == "resp_page"
    read = requests.get(router.url + "/v1/responses/resp_page", timeout=30)
    assert read.status_code == 502
    assert read.json()["error"]["code"] == "upstream_error"
    assert "nginx" not in read.text
    assert "X-Upstream-Host" not in read.headers
