"""bench/frontends.py: the raw protocol speaks enough HTTP/1.1, and a short real run measures
every server without a failed request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from bench.frontends import ANSWER, SERVERS, RawHttp

from tests.support import run_bench


async def test_raw_protocol_answers_keep_alive_requests_and_split_bodies() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(RawHttp, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):  # one kept-alive connection, three exchanges
                async with session.post(f"http://127.0.0.1:{port}/x", data=b"{}") as resp:
                    assert resp.status == 200
                    assert await resp.read() == ANSWER
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{}")
        await writer.drain()
        await asyncio.sleep(0.05)
        assert reader._buffer == b""  # type: ignore[attr-defined]  # body not whole: no answer
        writer.write(b"{}")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert await reader.readexactly(len(ANSWER)) == ANSWER
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.timeout(120)
def test_a_short_run_measures_every_server(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    args = ["--rate", "50", "--duration", "0.4", "--rounds", "2", "--json", str(out)]
    assert run_bench("frontends", *args).startswith("placement: ")
    rows = json.loads(out.read_text())["rows"]
    assert [r["server"] for r in rows] == list(SERVERS)
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in rows)
