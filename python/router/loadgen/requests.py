"""Pure: request bodies for OpenAI-compatible endpoints, and endpoint URLs from a base URL."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

import msgspec

from router.loadgen.runner import RequestFactory
from router.loadgen.sample import Planned
from router.loadgen.sse import Endpoint

_PATHS: dict[Endpoint, str] = {"chat": "/chat/completions", "completions": "/completions"}


def endpoint_url(base: str, endpoint: Endpoint) -> str:
    """`http://h:p`, `http://h:p/v1` or a full endpoint URL -> the endpoint URL; a query is kept.

    ValueError for a URL that is not http(s), has a bad port, or names the other endpoint.
    """
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {base!r}")
    try:
        port = parts.port  # ValueError past 65535 or not a number
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"the port of {base!r} is not in 1-65535")
    path = parts.path.rstrip("/")
    # Longest first: "/completions" is also the end of "/chat/completions".
    for named in sorted(_PATHS, key=lambda e: -len(_PATHS[e])):
        if path.endswith(_PATHS[named]):
            if named != endpoint:
                raise ValueError(f"{base!r} is the {named} endpoint, not {endpoint}")
            path = path.removesuffix(_PATHS[named])
            break
    if not path.endswith("/v1"):
        path += "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path + _PATHS[endpoint], parts.query, ""))


def body(prompt: str, *, model: str, endpoint: Endpoint, max_tokens: int, stream: bool) -> bytes:
    """A minimal chat or completions request body."""
    payload: dict[str, object] = {"model": model, "max_tokens": max_tokens, "stream": stream}
    if endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    return msgspec.json.encode(payload)


def round_robin(
    url: str,
    prompts: Sequence[str],
    *,
    model: str,
    endpoint: Endpoint,
    max_tokens: int,
    stream: bool,
) -> RequestFactory:
    """A factory cycling through `prompts`, bodies encoded once up front."""
    if not prompts:
        raise ValueError("at least one prompt is needed")
    bodies = [
        body(p, model=model, endpoint=endpoint, max_tokens=max_tokens, stream=stream)
        for p in prompts
    ]

    def factory(index: int) -> Planned:
        return Planned(url=url, body=bodies[index % len(bodies)])

    return factory
