"""`router demo`: three simulated regions (20/80/150 ms RTT) and the router in front, in-process."""

from __future__ import annotations

import logging
import socket

import uvloop
from aiohttp import web

from router.config import Config, loads
from router.server import gctune
from router.server.app import build_app
from router.server.run import make_runner, run_until_signal
from router.sim.server import SimOptions, build_sim_app, sim_runner

# (name, RTT ms) of the simulated regions; the router prefers the nearest (lowest bias_ms).
DEMO_REGIONS = (("eu-west", 20.0), ("us-east", 80.0), ("ap-south", 150.0))

DEFAULT_CONFIG = """\
# The embedded demo config: three simulated regions on free local ports.
[server]
listen = "127.0.0.1:{router_port}"

[timeouts]
connect = 1.0
first_byte = 10.0
idle = 10.0
total = 120.0

[models]
aliases = {{ "gpt-4o-mini" = "sim-1" }}

[auth]
enabled = false
{regions}"""

REGION_TEMPLATE = """
[[regions]]
name = "{name}"
base_url = "http://127.0.0.1:{port}/v1"
models = ["sim-1"]
kind = "sim"
bias_ms = {rtt}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def demo_config(router_port: int, region_ports: list[int]) -> Config:
    """The embedded default config for the given ports."""
    regions = "".join(
        REGION_TEMPLATE.format(name=name, port=port, rtt=rtt)
        for (name, rtt), port in zip(DEMO_REGIONS, region_ports, strict=True)
    )
    return loads(DEFAULT_CONFIG.format(router_port=router_port, regions=regions), "<demo config>")


def banner(url: str) -> str:
    """What the demo prints once it is ready."""
    return f"""
router demo: listening on {url}  (regions: {", ".join(f"{n} {r:g} ms" for n, r in DEMO_REGIONS)})

  curl -sN {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "gpt-4o-mini", "stream": true,
         "messages": [{{"role": "user", "content": "Hi"}}]}}'

  python -c "from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='demo'); \\
print(c.chat.completions.create(model='gpt-4o-mini', \\
messages=[{{'role': 'user', 'content': 'Hi'}}]).choices[0].message.content)"

Ctrl-C to stop.
"""


async def _run(router_port: int) -> None:
    region_ports = [_free_port() for _ in DEMO_REGIONS]
    config = demo_config(router_port or _free_port(), region_ports)
    sims: list[web.AppRunner] = []
    for (name, rtt), port in zip(DEMO_REGIONS, region_ports, strict=True):
        options = SimOptions(name=name, rtt_ms=rtt, ttft_ms=50, tokens_per_s=40)
        runner = sim_runner(build_sim_app(options))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        sims.append(runner)
    try:
        router = make_runner(build_app(config), config)

        async def started() -> None:
            gctune.tune(config.server.gc_gen0_threshold)

        await run_until_signal(
            router, config.server.listen, lambda url: print(banner(url), flush=True), extra=started
        )
    finally:
        for runner in sims:
            await runner.cleanup()


def run_demo(router_port: int = 0) -> int:
    """Run the demo until Ctrl-C; 0 on a clean stop."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    uvloop.run(_run(router_port))
    return 0
