"""Streams settle token limits with the region's own usage, asked for on the client's behalf."""

from __future__ import annotations

import hashlib
import json

import requests

from tests.integration.conftest import MODEL, RouterFactory, SimFactory, region_toml, sim_stats

KEY = "sk-usage-0123456789"
AUTH = (
    "[auth]\n[[auth.keys]]\n"
    f'sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"\n'
    'tenant = "t"\ntokens_per_minute = 100000\n'
)


def test_a_token_limited_stream_asks_for_usage_and_the_client_never_sees_it(
    sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    region = sim_region("a")
    router = router_proc(AUTH + region_toml(region))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count me"}],
        "stream": True,
        "max_tokens": 20,
    }
    resp = requests.post(
        router.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=20,
    )
    assert resp.status_code == 200
    payloads = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    assert not any('"usage": {' in p or '"usage":{' in p for p in payloads)
    sent = json.loads(sim_stats(region)["last_body"])
    assert sent["stream_options"] == {"include_usage": True}
    # A client that asked gets the usage chunk, and the region sees its own request unchanged.
    body["stream_options"] = {"include_usage": True}
    asked = requests.post(
        router.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=20,
    )
    chunks = [line[6:] for line in asked.text.split("\n") if line.startswith("data: {")]
    assert json.loads(chunks[-1])["usage"]["completion_tokens"] > 0
