"""The /status page in headless Chromium (Debian's `chromium`), driven over the DevTools protocol:
it loads, shows the regions, and updates when a region goes down."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import MODEL, region_toml, start_router, start_sim
from tests.support import Proc, free_port, spawn

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium")
HEADER = """
[timeouts]
connect = 0.5
first_byte = 5.0

[auth]
enabled = false

[observability]
status_refresh_ms = 200
"""
# Rows of the region table as [name, health, TTFT p95 cell, has a chart].
ROWS_JS = """JSON.stringify([...document.querySelectorAll('#regions tr')].map(tr => [
  tr.dataset.region, tr.dataset.health, tr.children[4].textContent,
  tr.querySelector('svg.chart polyline') !== null]))"""


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Proc, Proc, Proc]]:
    a = start_sim(tmp_path, "a")
    b = start_sim(tmp_path, "b")
    router = start_router(tmp_path, HEADER + region_toml(a) + region_toml(b, bias_ms=50.0))
    yield a, b, router
    for proc in (router, a, b):
        proc.kill()


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Proc]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make system-deps or .ci/run installs it)")
    port = free_port()
    args = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",  # tests may run as root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        # Anything not on loopback (loopback always bypasses the proxy) goes nowhere.
        "--proxy-server=http://127.0.0.1:9",
        "--remote-debugging-address=127.0.0.1",
        f"--remote-debugging-port={port}",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "about:blank",
    ]
    proc = spawn(args, port, tmp_path / "chromium.log", ready_timeout=30.0)
    yield proc
    proc.kill()


class Page:
    """One browser tab over the DevTools websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self._ws.send_json({"id": msg_id, "method": method, "params": params})
        while True:
            reply = json.loads(await asyncio.wait_for(self._ws.receive_str(), timeout=10))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def wait_for(self, expression: str, predicate: Any, limit_s: float = 15.0) -> Any:
        """Poll `expression` until predicate(value) holds; the page updates on its own."""
        deadline = asyncio.get_running_loop().time() + limit_s
        value = None
        while asyncio.get_running_loop().time() < deadline:
            value = await self.evaluate(expression)
            if predicate(value):
                return value
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out; last value: {value!r}")


@pytest.fixture
async def page(chromium: Proc) -> AsyncIterator[Page]:
    async with aiohttp.ClientSession() as http:
        async with http.get(chromium.url + "/json/list") as resp:
            targets = await resp.json()
        target = next(t for t in targets if t["type"] == "page")
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            yield Page(ws)


async def chat(http: aiohttp.ClientSession, router: Proc, content: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def test_page_shows_regions_and_updates_when_one_dies(
    stack: tuple[Proc, Proc, Proc], page: Page
) -> None:
    a, _, router = stack
    async with aiohttp.ClientSession() as http:
        for i in range(3):
            assert await chat(http, router, f"warm {i}") == 200
        await page.send("Page.navigate", url=router.url + "/status")

        rows = await page.wait_for(
            ROWS_JS, lambda v: v is not None and len(json.loads(v)) == 2 and
            json.loads(v)[0][1] == "up"
        )  # fmt: skip
        rows = json.loads(rows)
        assert [r[0] for r in rows] == ["a", "b"]
        assert rows[0][1] == "up"  # a served the warm-up requests
        assert rows[0][2].endswith("ms")  # TTFT p95 of a is shown
        assert all(r[3] for r in rows)  # a latency chart per region
        assert await page.evaluate("document.getElementById('requests').textContent") == "3"
        updates = int(await page.evaluate("document.body.dataset.updates"))

        a.kill()  # SIGKILL: the region is gone mid-run
        assert await chat(http, router, "after the kill") == 200  # failed over to b

        rows = await page.wait_for(ROWS_JS, lambda v: json.loads(v)[0][1] == "down")
        assert json.loads(rows)[1][1] == "up"
        # The page kept polling on its own: more renders since the kill, request count moved.
        assert int(await page.evaluate("document.body.dataset.updates")) > updates
        await page.wait_for("document.getElementById('requests').textContent", lambda v: v == "4")
        ejections = await page.evaluate(
            "document.querySelector('tr[data-region=a]').children[8].textContent"
        )
        # How many ejections a dead region earns is the health policy's call; it is shown.
        assert ejections.isdigit()
