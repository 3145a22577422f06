"""How much of the router one request passes through: modules and functions entered.

Starts one simulated region (a subprocess), runs the router in this process (build_app with auth
off, everything else on defaults, `--cache` adds the normalized cache), sends a few warm-up
requests, then counts every router function entered (sys.setprofile) during one streamed chat
request and prints the modules, the functions and the calls per module.

    python -m bench.request_path [--cache] [--json out.json]

Works on older trees of the router too (it imports build_app where each layout kept it), so a
before/after comparison runs the same script with PYTHONPATH pointing at the other tree.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
from aiohttp import web
from bench.outputs import check_file
from tests.support import free_port, router_cmd, spawn

BODY = {
    "model": "sim-1",
    "messages": [{"role": "user", "content": "Trace the request path."}],
    "stream": True,
    "temperature": 0,
}


def _build_app() -> Callable[..., web.Application]:
    for name in ("router.server.app", "router.app"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        build: Callable[..., web.Application] = module.build_app
        return build
    raise SystemExit("no build_app found")


def _loads() -> Callable[[str], Any]:
    from router.config import loads

    return loads


async def _trace(port: int, region_url: str, cache: bool, root: str) -> dict[str, Any]:
    text = f"""
[server]
listen = "127.0.0.1:{port}"
[auth]
enabled = false
[observability]
access_log = false
[cache]
enabled = {"true" if cache else "false"}
level = "normalized"
[[regions]]
name = "a"
base_url = "{region_url}/v1"
models = ["sim-1"]
"""
    app = _build_app()(_loads()(text))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(root):
                rel = Path(code.co_filename).resolve().relative_to(Path(root).parent)
                module = ".".join(rel.with_suffix("").parts)
                calls[(module, code.co_qualname)] += 1

    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for i in range(5):
            warm = dict(BODY, messages=[{"role": "user", "content": f"warm {i}"}])
            async with session.post(url, json=warm) as resp:
                await resp.read()
        await asyncio.sleep(0.2)
        sys.setprofile(profile)
        try:
            async with session.post(url, json=BODY) as resp:
                body = await resp.read()
        finally:
            sys.setprofile(None)
    await runner.cleanup()
    if not body.rstrip().endswith(b"[DONE]"):
        raise SystemExit(f"the traced request did not complete: {body[-200:]!r}")
    per_module: collections.Counter[str] = collections.Counter()
    for (module, _), n in calls.items():
        per_module[module] += n
    return {
        "modules": len(per_module),
        "functions": len(calls),
        "calls": sum(calls.values()),
        "per_module": dict(per_module.most_common()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", action="store_true", help="normalized cache on")
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()
    check_file(parser, "--json", args.json)
    with tempfile.TemporaryDirectory() as tmp:
        region_port = free_port()
        region = spawn(
            router_cmd("sim-region", "--port", str(region_port), "--name", "a"),
            region_port,
            Path(tmp) / "region.log",
        )
        try:
            import router

            root = str(Path(router.__file__).resolve().parent)
            result = asyncio.run(_trace(free_port(), region.url, args.cache, root))
        finally:
            region.kill()
    print(
        f"one streamed chat request{' (cache on)' if args.cache else ''}: "
        f"{result['modules']} modules, {result['functions']} functions, {result['calls']} calls"
    )
    for module, n in result["per_module"].items():
        print(f"  {n:5d}  {module}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
