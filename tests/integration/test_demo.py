"""`router demo`: the embedded default config, three sim regions and the router, until Ctrl-C."""

from __future__ import annotations

import signal
from pathlib import Path

import openai

from router.demo import DEMO_REGIONS, demo_config
from tests.support import free_port, router_cmd, spawn


def test_demo_config_prefers_the_nearest_region() -> None:
    config = demo_config(8080, [9001, 9002, 9003])
    assert [r.name for r in config.regions] == [name for name, _ in DEMO_REGIONS]
    assert [r.bias_ms for r in config.regions] == [20.0, 80.0, 150.0]
    assert "gpt-4o-mini" in config.served_models()


def test_demo_serves_the_printed_examples_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    proc = spawn(router_cmd("demo", "--port", str(port)), port, tmp_path / "demo.log")
    try:
        client = openai.OpenAI(base_url=f"{proc.url}/v1", api_key="demo", max_retries=0)
        with client:
            out = client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=3,
            )
            assert out.choices[0].finish_reason == "length"
            assert out.usage is not None
            assert out.usage.completion_tokens == 3
            models = {m.id for m in client.models.list()}
        assert models == {"gpt-4o-mini", "sim-1"}
        banner = proc.output()
        assert f"curl -sN {proc.url}/v1/chat/completions" in banner
        assert f"base_url='{proc.url}/v1'" in banner
        proc.popen.send_signal(signal.SIGINT)
        assert proc.popen.wait(timeout=20) == 0
    finally:
        proc.kill()
