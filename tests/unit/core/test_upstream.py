"""The request a region gets: which client headers pass, the region's key, the request id."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from router.config import RegionConfig
from router.core.transport import LocalReply, LocalTransport
from router.core.upstream import Upstream, upstream_id

CLIENT = {
    "Authorization": "Bearer sk-client",
    "X-Request-Id": "client-id",
    "X-Correlation-Id": "client-corr",
    "OpenAI-Beta": "assistants=v2",
}


def region(**fields: object) -> Upstream:
    config = RegionConfig(name="a", base_url="http://127.0.0.1:1/v1", models=("m",), **fields)  # type: ignore[arg-type]
    return Upstream(config, LocalTransport(_never), "sk-region")


async def _never(path: str, body: bytes, headers: object) -> LocalReply:
    raise AssertionError("no request is sent")


@pytest.mark.parametrize("header", ["X-Request-Id", "X-Correlation-Id", ""])
def test_the_request_id_goes_in_the_configured_header_or_nowhere(header: str) -> None:
    sent = region(request_id_header=header).request_headers(CLIENT, "req-1")
    assert sent["Authorization"] == "Bearer sk-region"
    assert sent["OpenAI-Beta"] == "assistants=v2"
    # The client's own id never passes as it came; the configured header carries the router's.
    assert "X-Request-Id" not in sent or header == "X-Request-Id"
    if header:
        assert sent.getall(header) == [upstream_id("req-1")]
    else:
        assert "X-Request-Id" not in sent
        assert sent["X-Correlation-Id"] == "client-corr"  # any other header passes


def _head(*fields: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(fields))


def test_response_headers_keep_only_what_is_a_regions_to_send() -> None:
    head = _head(
        ("Content-Type", "application/json"),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "named in Connection"),
        ("openai-organization", "org-operator"),
        ("x-ratelimit-remaining-requests", "9"),
        ("RateLimit-Policy", "10;w=60"),
        ("X-Router-Hedged", "spoofed"),
        ("Age", "9"),
        ("Strict-Transport-Security", "max-age=0"),
        ("Location", "http://evil.example/"),
        ("X-Request-Id", "region-id"),
        ("X-sk-region", "1"),
        ("x-SK-REGION-2", "1"),
        ("x-SK-REGION", "the same name again"),
        ("X-Value", "Bearer sk-region"),
        ("X-Utf8", "café"),
        ("openai-processing-ms", "12"),
    )
    out = region().response_headers(head)
    assert list(out.items()) == [
        ("Content-Type", "application/json"),
        ("X-Utf8", "café"),
        ("openai-processing-ms", "12"),
    ]


def test_response_headers_keep_nothing_a_shared_cache_would_act_on() -> None:
    """Issue: a region's caching headers were relayed, so a CDN or shared cache in front of
    the router could store one tenant's answer and serve it to another."""
    head = _head(
        ("Content-Type", "application/json"),
        ("Cache-Control", "public, max-age=86400"),
        ("CDN-Cache-Control", "max-age=86400"),
        ("Surrogate-Control", "max-age=86400"),
        ("X-Accel-Expires", "86400"),
        ("Expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
        ("Pragma", "cache"),
        ("ETag", '"tenant-a"'),
        ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"),
        ("Vary", "Accept-Encoding"),
        ("Set-Cookie", "lb=node-7"),
        ("X-Accel-Buffering", "no"),
    )
    out = region().response_headers(head)
    assert list(out.items()) == [
        ("Content-Type", "application/json"),
        ("X-Accel-Buffering", "no"),
    ]
