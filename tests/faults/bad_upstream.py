"""A deliberately broken OpenAI-compatible region, for the fault suite.

`python -m tests.faults.bad_upstream --port P --mode MODE` answers every request on 127.0.0.1 in one
broken way; GET /health answers 200 so the router's prober keeps it in rotation (the break is only
on the inference path, where a real region hurts most).

Modes: blackhole (read the request, never answer), html (200 with an HTML page), badjson (200
application/json that is not JSON), badsse (200 text/event-stream whose events are not JSON and
that ends without [DONE]), nodone (valid SSE chunks, then a clean close without [DONE]), big (a
64 MiB JSON body), drip (200 headers, then one byte a second).

Hostile modes (an attacker's region, issue 24): hugeheaders (64 MiB of response headers),
manyheaders (200,000 small headers), redirect (307 to another host), cookies (a good answer
with Set-Cookie, a CORS grant and a false Content-Encoding: gzip), echo (500 whose body echoes
the request's headers, the router's key for the region included), longline (a stream whose
second event is one 8 MiB line that never ends), stored (makes Responses API responses, id
`resp_<input>`, then reads `resp_echo` back as the echo mode's 500, `resp_gzip` as a 200 whose
Content-Encoding is a false gzip and `resp_page` as a load balancer's HTML 502), spoof (a good
answer with headers that are not a region's to send: the operator's organization, the provider
account's rate limits, the router's own names, policies for the router's origin, the router's
key for the region in header names, a latin-1 value, caching headers for a shared cache), lb502,
lb429 and lb404 (a load balancer's HTML error page naming an internal host, the 429 with a
Retry-After, the 404 of an ingress without the route), flat503 (vLLM's flat error object in a
503).

Streams at the edges of SSE (issue 27): splitstart (a whole stream whose first read is `da`),
bom (a stream after a UTF-8 byte order mark), strayline (a whole stream, then a lone newline),
noblank (a whole stream whose `data: [DONE]` lacks its blank line), keepalive (comments every
0.2 s, never a token), errorevent (vLLM's failure inside a stream: an error event, [DONE]),
stallbody (a whole answer's head and its first bytes, then nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import json

MODES = (
    "blackhole",
    "html",
    "badjson",
    "badsse",
    "nodone",
    "big",
    "drip",
    "hugeheaders",
    "manyheaders",
    "redirect",
    "cookies",
    "echo",
    "longline",
    "stored",
    "spoof",
    "lb502",
    "lb429",
    "flat503",
    "lb404",
    "splitstart",
    "bom",
    "strayline",
    "noblank",
    "keepalive",
    "errorevent",
    "stallbody",
)
_MAX_HEAD = 64 * 1024
# Stops a forgotten server by itself: the suite never needs it this long.
_LIFETIME_S = 300.0


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes, bytes] | None:
    """The request line's path, its body and its head; None when the client went away."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head[:_MAX_HEAD].decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip() or 0)
    body = await reader.readexactly(length) if length else b""
    return path, body, head


def _head(status: str, content_type: str, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra}Connection: close\r\n\r\n"
    ).encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _sse_event(content: str, finish: str | None = None) -> bytes:
    delta = {"content": content} if finish is None else {}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    event = {"id": "bad-1", "object": "chat.completion.chunk", "choices": [choice]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def _answer(mode: str, writer: asyncio.StreamWriter, body: bytes, head: bytes) -> None:
    stream = b'"stream": true' in body or b'"stream":true' in body
    if mode == "hugeheaders":
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: ")
        piece = b"a" * (1024 * 1024)
        for _ in range(64):
            writer.write(piece)
            await writer.drain()
        writer.write(b"\r\n\r\n")
    elif mode == "manyheaders":
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for start in range(0, 200_000, 10_000):
            writer.write(b"".join(b"X-%d: v\r\n" % i for i in range(start, start + 10_000)))
            await writer.drain()
        writer.write(b"Content-Length: 2\r\n\r\n{}")
    elif mode == "redirect":
        where = "Location: http://127.0.0.2:9/v1/chat/completions\r\nContent-Length: 0\r\n"
        writer.write(_head("307 Temporary Redirect", "text/plain", where))
    elif mode == "cookies":
        answer = json.dumps(
            {
                "id": "c",
                "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
            }
        ).encode()
        extra = (
            "Set-Cookie: session=stolen; Path=/\r\nAccess-Control-Allow-Origin: *\r\n"
            f"Content-Encoding: gzip\r\nContent-Length: {len(answer)}\r\n"
        )
        writer.write(_head("200 OK", "application/json", extra) + answer)
    elif mode == "echo":
        writer.write(_echo(head))
    elif mode == "spoof":
        writer.write(_spoof(head))
    elif mode in ("lb502", "lb429", "lb404"):
        page = (
            b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1>"
            b"<p>upstream vllm-node-7.internal.corp:8000 (10.3.4.5) connect() failed</p>"
            b"<hr><center>nginx/1.18.0 (Ubuntu)</center></body></html>"
        )
        status = {"lb502": "502 Bad Gateway", "lb429": "429 Too Many Requests"}.get(mode, "")
        if mode == "lb404":
            status = "404 Not Found"
            page = (
                b"<html><head><title>404 Not Found</title></head><body><h1>404 Not Found</h1>"
                b"<p>no route to vllm-node-7.internal.corp:8000 (10.3.4.5)</p>"
                b"<hr><center>nginx/1.18.0 (Ubuntu)</center></body></html>"
            )
        extra = f"X-Upstream-Host: 10.3.4.5:8000\r\nContent-Length: {len(page)}\r\n"
        if mode == "lb429":
            extra += "Retry-After: 30\r\n"
        writer.write(_head(status, "text/html", extra) + page)
    elif mode == "flat503":
        flat = {
            "object": "error",
            "message": "The engine is overloaded.",
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
        data = json.dumps(flat).encode()
        extra = f"Content-Length: {len(data)}\r\n"
        writer.write(_head("503 Service Unavailable", "application/json", extra) + data)
    elif mode == "longline":
        writer.write(_head("200 OK", "text/event-stream", "Transfer-Encoding: chunked\r\n"))
        writer.write(_chunk(_sse_event("Hello")))
        writer.write(_chunk(b"data: "))
        for _ in range(8 * 16):
            writer.write(_chunk(b"x" * 65536))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
    elif mode in _EDGES:
        writer.write(_head("200 OK", "text/event-stream", "Transfer-Encoding: chunked\r\n"))
        for piece in _EDGES[mode]:
            if isinstance(piece, float):
                await writer.drain()
                await asyncio.sleep(piece)
            else:
                writer.write(_chunk(piece))
        writer.write(b"0\r\n\r\n")
    elif mode == "blackhole":
        await asyncio.sleep(_LIFETIME_S)
    elif mode == "stallbody":
        writer.write(_head("200 OK", "application/json", "Content-Length: 100\r\n") + b'{"id": "x"')
        await writer.drain()
        await asyncio.sleep(_LIFETIME_S)
    elif mode == "html":
        page = b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"
        writer.write(_head("200 OK", "text/html", f"Content-Length: {len(page)}\r\n") + page)
    elif mode == "badjson":
        text = b'{"id": "x", "choices": [{"message": {"content": "trunc'
        writer.write(_head("200 OK", "application/json", f"Content-Length: {len(text)}\r\n") + text)
    elif mode == "badsse":
        writer.write(_head("200 OK", "text/event-stream", "Transfer-Encoding: chunked\r\n"))
        writer.write(_chunk(b"data: {this is not json\n\n"))
        writer.write(_chunk(b"garbage line without a field name\n\n"))
        writer.write(b"0\r\n\r\n")
    elif mode == "nodone":
        writer.write(_head("200 OK", "text/event-stream", "Transfer-Encoding: chunked\r\n"))
        for word in ("Hello", " there", " and"):
            writer.write(_chunk(_sse_event(word)))
        writer.write(b"0\r\n\r\n")
    elif mode == "big":
        size = 64 * 1024 * 1024
        writer.write(_head("200 OK", "application/json", f"Content-Length: {size}\r\n"))
        piece = b" " * (1024 * 1024)
        for _ in range(64):
            writer.write(piece)
            await writer.drain()
    elif mode == "drip":
        ctype = "text/event-stream" if stream else "application/json"
        writer.write(_head("200 OK", ctype, "Transfer-Encoding: chunked\r\n"))
        payload = _sse_event("drip") if stream else b'{"id": "drip", "choices": []}'
        for byte in payload:
            writer.write(_chunk(bytes([byte])))
            await writer.drain()
            await asyncio.sleep(1.0)
        writer.write(b"0\r\n\r\n")
    await writer.drain()


_WHOLE = b"".join(
    (_sse_event("Hello"), _sse_event(" there"), _sse_event("", "stop"), b"data: [DONE]\n\n")
)
_ERROR = b'data: {"error": {"message": "engine crashed", "type": "server_error", "code": 500}}\n\n'
# Each edge mode's body: its chunks, and pauses (seconds) that keep them apart on the wire.
_EDGES: dict[str, list[bytes | float]] = {
    "splitstart": [_WHOLE[:2], 0.05, _WHOLE[2:]],
    "bom": [b"\xef\xbb\xbf" + _WHOLE],
    "strayline": [_WHOLE, 0.05, b"\n"],
    "noblank": [_WHOLE[:-1]],
    "keepalive": [p for _ in range(50) for p in (b": keep-alive\n\n", 0.2)],
    "errorevent": [_ERROR + b"data: [DONE]\n\n"],
}


def _echo(head: bytes) -> bytes:
    echoed = json.dumps({"error": {"message": head.decode("latin-1"), "type": "server"}})
    data = echoed.encode()
    return (
        _head("500 Internal Server Error", "application/json", f"Content-Length: {len(data)}\r\n")
        + data
    )


def _spoof(head: bytes) -> bytes:
    """A good answer with headers no client may get from a region (see the module's doc)."""
    key = b""
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"authorization: bearer "):
            key = line[len(b"authorization: bearer ") :]
    answer = json.dumps(
        {
            "id": "spoof",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
        }
    ).encode()
    fields = [
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(answer),
        b"Connection: close, X-Hop",
        b"X-Hop: named in Connection",
        b"openai-organization: org-operator",
        b"openai-project: proj_operator",
        b"anthropic-organization-id: org-operator",
        b"x-ratelimit-limit-requests: 10000",
        b"x-ratelimit-remaining-tokens: 1999999",
        b"anthropic-ratelimit-requests-limit: 50",
        b"RateLimit-Policy: 10;w=60",
        b"x-router-hedged: spoofed",
        b"x-router-region: spoofed",
        b"X-Request-Id: region-id",
        b"x-cache: HIT",
        b"Age: 99999",
        b"Server-Timing: region;dur=1",
        b"Strict-Transport-Security: max-age=0",
        b'Alt-Svc: h2="evil.example:443"',
        b'Clear-Site-Data: "*"',
        b"WWW-Authenticate: Basic realm=x",
        b"Location: http://evil.example/",
        b"Content-Location: http://10.3.4.5/v1/chat/completions",
        b"Refresh: 0; url=http://evil.example/",
        b"Via: 1.1 lb-7.internal",
        b"X-Powered-By: Express",
        b"Cache-Control: public, max-age=86400",
        b"CDN-Cache-Control: max-age=86400",
        b"Surrogate-Control: max-age=86400",
        b"X-Accel-Expires: 86400",
        b"Expires: Thu, 01 Jan 2099 00:00:00 GMT",
        b"Pragma: cache",
        b'ETag: "tenant-a-answer"',
        b"Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT",
        b"Vary: Accept-Encoding",
        b"Set-Cookie: lb=node-7; Path=/",
        b"X-" + key + b": in a name",
        b"x-" + key.lower() + b": in a name, folded",
        b"X-Key-Value: " + key,
        b"X-Latin: caf\xe9",
        "X-Utf8: café".encode(),
        b"X-Kept: yes",
    ]
    return b"HTTP/1.1 200 OK\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n" + answer


def _stored(path: str, body: bytes, head: bytes) -> bytes:
    """The stored mode's answer: a made response, or a hostile read of one."""
    if path.endswith("/responses"):
        made = {"id": f"resp_{json.loads(body)['input']}", "object": "response"}
        data = json.dumps({**made, "status": "completed", "output": []}).encode()
        return _head("200 OK", "application/json", f"Content-Length: {len(data)}\r\n") + data
    if path.endswith("/resp_echo"):
        return _echo(head)
    if path.endswith("/resp_redirect"):
        return _head(
            "302 Found", "text/plain", "Location: http://127.0.0.1:9/x\r\nContent-Length: 0\r\n"
        )
    if path.endswith("/resp_page"):
        page = b"<html><body><h1>502 Bad Gateway</h1>upstream 10.3.4.5:8000 nginx</body></html>"
        extra = f"X-Upstream-Host: 10.3.4.5\r\nContent-Length: {len(page)}\r\n"
        return _head("502 Bad Gateway", "text/html", extra) + page
    if path.endswith("/resp_refused"):
        data = b'{"error": {"message": "Incorrect API key provided"}}'
        return (
            _head("401 Unauthorized", "application/json", f"Content-Length: {len(data)}\r\n") + data
        )
    data = b'{"id": "resp_gzip", "object": "response"}'
    extra = f"Content-Encoding: gzip\r\nContent-Length: {len(data)}\r\n"
    return _head("200 OK", "application/json", extra) + data


async def _serve_one(mode: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await _read_request(reader)
        if request is None:
            return
        path, body, head = request
        if path.endswith("/health") or path.endswith("/models"):
            ok = b'{"object": "list", "data": [{"id": "sim-1", "object": "model"}]}'
            writer.write(_head("200 OK", "application/json", f"Content-Length: {len(ok)}\r\n") + ok)
            await writer.drain()
            return
        if mode == "stored":
            writer.write(_stored(path, body, head))
            await writer.drain()
        else:
            await _answer(mode, writer, body, head)
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _main(port: int, mode: str) -> None:
    server = await asyncio.start_server(
        lambda r, w: _serve_one(mode, r, w), "127.0.0.1", port, limit=_MAX_HEAD
    )
    async with server:
        await asyncio.sleep(_LIFETIME_S)


def main() -> None:
    """Parse flags and serve until the lifetime ends or the process is killed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    args = parser.parse_args()
    asyncio.run(_main(args.port, args.mode))


if __name__ == "__main__":
    main()
