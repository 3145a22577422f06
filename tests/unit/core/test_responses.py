"""What the client gets when every region failed: a region's API error, or the router's own."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from router.core.failure import AttemptError, FailureKind
from router.core.responses import failure_response, refusal_response

PAGE = b"<html><body><h1>502 Bad Gateway</h1>upstream 10.3.4.5:8000 nginx/1.18.0</body></html>"


def _failed(status: int, body: bytes, **headers: str) -> AttemptError:
    fields = CIMultiDict({"Content-Type": "text/html", "X-Upstream-Host": "10.3.4.5", **headers})
    return AttemptError("a", FailureKind.STATUS, "", status=status, headers=fields, body=body)


@pytest.mark.parametrize(
    ("status", "answered", "code"),
    [
        (500, 502, "upstream_error"),
        (502, 502, "upstream_error"),
        (503, 503, "upstream_unavailable"),
        (504, 504, "upstream_timeout"),
        (429, 429, "upstream_rate_limited"),
        (400, 400, "upstream_refused"),
    ],
)
@pytest.mark.parametrize("body", [PAGE, b"", b'{"detail": "no"}', b'{"error": "text"}'])
def test_an_answer_that_is_no_api_error_becomes_the_routers_own(
    status: int, answered: int, code: str, body: bytes
) -> None:
    resp = failure_response(_failed(status, body, **{"Retry-After": "7"}), "req-1")
    assert resp.status == answered
    assert resp.body is not None
    assert json.loads(resp.body)["error"]["code"] == code  # type: ignore[arg-type]
    assert b"10.3.4.5" not in resp.body  # type: ignore[operator]
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.headers["Retry-After"] == "7"
    assert "X-Upstream-Host" not in resp.headers
    assert resp.headers["X-Request-Id"] == "req-1"


def test_on_the_messages_api_it_is_in_anthropics_shape() -> None:
    resp = failure_response(_failed(503, PAGE), "req-1", anthropic=True)
    assert resp.status == 503
    doc = json.loads(resp.body)  # type: ignore[arg-type]
    assert (doc["type"], doc["error"]["type"]) == ("error", "overloaded_error")
    assert "nginx" not in doc["error"]["message"]


def test_an_api_error_is_relayed_and_vllms_flat_one_in_openais_shape() -> None:
    error = b'{"error": {"message": "busy", "type": "server_error", "code": null}}'
    resp = failure_response(_failed(503, error, **{"X-Region": "kept"}), "req-1")
    assert (resp.status, resp.body, resp.headers["X-Region"]) == (503, error, "kept")
    flat = {"object": "error", "message": "too long", "type": "BadRequestError", "param": None}
    resp = failure_response(_failed(400, json.dumps({**flat, "code": 400}).encode()), "req-1")
    assert resp.status == 400
    assert json.loads(resp.body) == {  # type: ignore[arg-type]
        "error": {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}
    }
    assert resp.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("body", [PAGE, b"", b"Not Found", b'["not", "an object"]'])
def test_a_regions_own_4xx_that_is_no_api_error_is_the_routers_own(body: bytes) -> None:
    fields = CIMultiDict({"Content-Type": "text/html", "X-Upstream-Host": "10.3.4.5"})
    resp = refusal_response(404, fields, body, "req-1")
    assert resp is not None
    assert resp.status == 404
    assert json.loads(resp.body)["error"] == {  # type: ignore[arg-type]
        "message": "The region refused the request (HTTP 404).",
        "type": "invalid_request_error",
        "param": None,
        "code": "upstream_refused",
    }
    assert "X-Upstream-Host" not in resp.headers
    assert resp.headers["X-Request-Id"] == "req-1"


@pytest.mark.parametrize(
    "body",
    [
        b'{"error": {"message": "bad field", "type": "invalid_request_error"}}',
        b'{"object": "error", "message": "bad field", "type": "BadRequestError", "code": 400}',
        # Other servers' JSON errors (TGI's, FastAPI's): relayed byte-exact as before, too.
        b'{"error": "Input validation error: max_new_tokens must be <= 1024"}',
        b'{"detail": "Not Found"}',
    ],
)
def test_a_regions_own_4xx_api_error_is_left_to_relay_as_it_came(body: bytes) -> None:
    assert (
        refusal_response(400, CIMultiDict({"Content-Type": "application/json"}), body, "r") is None
    )
