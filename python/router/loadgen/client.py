"""I/O: send one OpenAI-compatible request and measure it, streaming-aware."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import aiohttp
import msgspec

from router.loadgen.sample import Planned, Sample
from router.loadgen.sse import DONE, Endpoint, StreamError, chunk_content
from router.net.sse import Decoder

REGION_HEADER = "x-router-region"
# The router's cache says hit/miss in x-cache (as CDNs do); x-router-cache is accepted too.
CACHE_HEADERS = ("x-router-cache", "x-cache")


class _ErrorBody(msgspec.Struct):
    error: dict[str, object] | None = None


_error_body = msgspec.json.Decoder(_ErrorBody)


def http_error_kind(status: int, body: bytes) -> str:
    """`http_<status>` plus the OpenAI error code when the body carries one."""
    try:
        err = _error_body.decode(body).error
    except msgspec.DecodeError:
        err = None
    code = err.get("code") if err else None
    return f"http_{status}:{code}" if isinstance(code, str) and code else f"http_{status}"


def _cache_outcome(headers: Mapping[str, str]) -> str | None:
    for name in CACHE_HEADERS:
        value = headers.get(name)
        if value:
            return value.lower()
    return None


async def send(
    session: aiohttp.ClientSession,
    planned: Planned,
    *,
    endpoint: Endpoint,
    stream: bool,
    timeout_s: float,
    start_s: float,
    t0: float,
) -> Sample:
    """Send `planned`; times are measured from t0 + start_s (the intended send time)."""
    begin = t0 + start_s
    sample = Sample(start_s=start_s, total_s=0.0, label=planned.label)
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(planned.url, data=planned.body) as resp:
                sample.status = resp.status
                sample.region = resp.headers.get(REGION_HEADER)
                sample.cache = _cache_outcome(resp.headers)
                if resp.status >= 400:
                    sample.error = http_error_kind(resp.status, await resp.read())
                elif stream and resp.content_type != "text/event-stream":
                    # Asked for a stream, got something else: say so rather than "cut".
                    await resp.read()
                    sample.error = "not_sse"
                elif stream:
                    await _read_stream(resp, sample, endpoint, begin)
                else:
                    await _read_body(resp, sample, endpoint)
    except TimeoutError:
        sample.error = "timeout"
    except aiohttp.ClientConnectorError:
        sample.error = "connect"
    except aiohttp.ClientError as exc:
        sample.error = _broken_kind(exc, got_head=sample.status != 0)
    except StreamError:
        sample.error = "stream_error"
    sample.total_s = time.perf_counter() - begin
    return sample


def _broken_kind(exc: aiohttp.ClientError, *, got_head: bool) -> str:
    """A connection that failed after the response head is a cut stream; before it, a drop."""
    if got_head:
        return "stream_cut"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return "disconnected"
    return f"client:{type(exc).__name__}"


async def _read_stream(
    resp: aiohttp.ClientResponse, sample: Sample, endpoint: Endpoint, begin: float
) -> None:
    parser = Decoder()
    last: float | None = None
    done = False
    async for raw in resp.content.iter_any():
        now = time.perf_counter()
        for payload in parser.feed(raw):
            if payload.strip() == DONE:
                done = True
                continue
            if not chunk_content(payload, endpoint):
                continue
            sample.chunks += 1
            if last is None:
                sample.ttft_s = now - begin
            else:
                sample.itl_s.append(now - last)
            last = now
    if not done:
        # The server closed the stream without the terminating [DONE]: a cut, not a success.
        sample.error = "stream_cut"
    elif last is None:
        # [DONE] without any content: nothing to time a first token by, so not an ok answer.
        sample.error = "empty"


async def _read_body(resp: aiohttp.ClientResponse, sample: Sample, endpoint: Endpoint) -> None:
    body = await resp.read()
    try:
        text = whole_text(body, endpoint)
    except StreamError:
        sample.error = "bad_response"
        return
    sample.chunks = 1 if text else 0


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None  # chat
    text: str | None = None  # completions


class _Whole(msgspec.Struct):
    choices: list[_Choice] | None = None
    error: dict[str, object] | None = None


_whole = msgspec.json.Decoder(_Whole)


def whole_text(body: bytes, endpoint: Endpoint) -> str:
    """The generated text of a whole (non-stream) answer; StreamError for an undecodable body,
    an error object or no choices, which a 200 must not count as an answer."""
    try:
        answer = _whole.decode(body)
    except msgspec.DecodeError as exc:
        raise StreamError("undecodable response body") from exc
    if answer.error is not None:
        raise StreamError(str(answer.error.get("message", answer.error)))
    if not answer.choices:
        raise StreamError("a response without choices")
    if endpoint == "chat":
        return "".join(c.message.content or "" for c in answer.choices if c.message is not None)
    return "".join(c.text or "" for c in answer.choices)
