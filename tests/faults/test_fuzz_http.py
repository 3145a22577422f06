"""Hypothesis-driven bodies and headers against a live router, on every API it serves: never a 5xx
for bad input, every error in its API's shape (OpenAI's, or Anthropic's for the Messages API),
and the router keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import MODEL, regions_toml, start_router, start_sim
from tests.support import Proc

ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/v1/messages",
    "/v1/messages/count_tokens",
)
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]) | json_values},
        optional={"content": st.text(max_size=60) | json_values, "name": json_values},
    ),
    max_size=4,
)
requests_ = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([MODEL, "no-such-model", ""]) | json_values,
        "messages": messages | json_values,
        "prompt": st.text(max_size=60) | json_values,
        "input": st.text(max_size=60) | messages | json_values,
        "instructions": st.text(max_size=30) | json_values,
        "system": st.text(max_size=30) | json_values,
        "max_tokens": st.integers(min_value=-5, max_value=50) | json_values,
        "max_output_tokens": st.integers(min_value=-5, max_value=50) | json_values,
        "store": st.booleans() | json_values,
        "previous_response_id": st.text(max_size=20) | json_values,
        "temperature": st.floats(allow_nan=False) | json_values,
        "stream": st.booleans() | json_values,
        "n": st.integers(min_value=-1, max_value=3),
    },
)
# Printable ASCII; stripped, as `requests` refuses to send a value with leading whitespace.
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60).map(
    str.strip
)


@pytest.fixture(scope="module")
def fuzz_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    directory = tmp_path_factory.mktemp("fuzz")
    sim = start_sim(directory, "a")
    router = start_router(directory, regions_toml(sim))
    yield router
    router.kill()
    sim.kill()


def _check(resp: requests.Response, endpoint: str) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        body = resp.json()
        error = body["error"]
        assert isinstance(error["message"], str)
        assert error["message"]
        assert isinstance(error["type"], str)
        if endpoint in ANTHROPIC:
            assert body["type"] == "error"
        else:
            assert "code" in error


@FUZZ
@given(endpoint=st.sampled_from(ENDPOINTS), payload=requests_)
def test_fuzzed_json_requests(fuzz_router: Proc, endpoint: str, payload: dict[str, Any]) -> None:
    body = json.dumps(payload, allow_nan=True).encode()
    resp = requests.post(
        fuzz_router.url + endpoint,
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=20,
    )
    _check(resp, endpoint)


@FUZZ
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    body=st.binary(max_size=300),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/json; charset=latin-1", ""]
    )
    | header_text,
    request_id=header_text,
    auth=header_text,
)
def test_fuzzed_bytes_and_headers(
    fuzz_router: Proc, endpoint: str, body: bytes, content_type: str, request_id: str, auth: str
) -> None:
    headers = {"Content-Type": content_type, "X-Request-Id": request_id, "Authorization": auth}
    resp = requests.post(fuzz_router.url + endpoint, data=body, headers=headers, timeout=20)
    _check(resp, endpoint)
    # A hostile request id is replaced, never echoed into a header verbatim.
    echoed = resp.headers.get("X-Request-Id", "")
    assert "\r" not in echoed
    assert "\n" not in echoed


@FUZZ
@given(
    response_id=st.text(max_size=40),
    suffix=st.sampled_from(["", "/input_items", "/cancel"]),
    method=st.sampled_from(["GET", "DELETE", "POST"]),
)
def test_fuzzed_stored_response_ids(
    fuzz_router: Proc, response_id: str, suffix: str, method: str
) -> None:
    """Any id, in any stored-response route: a clean answer (this router made none of them)."""
    path = "/v1/responses/" + requests.utils.quote(response_id, safe="") + suffix
    resp = requests.request(method, fuzz_router.url + path, timeout=20)
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert isinstance(error["message"], str)
        assert "type" in error


def test_router_alive_after_fuzzing(fuzz_router: Proc) -> None:
    resp = requests.post(
        fuzz_router.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=10,
    )
    assert resp.status_code == 200
