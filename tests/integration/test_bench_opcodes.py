"""bench/opcodes.py: module paths as the table shows them, and a short real run that counts
real requests through a real router, router-core and the same tree as a baseline, per module and
per function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.opcodes import module_of

from tests.support import run_bench


def test_module_paths_drop_where_they_were_installed() -> None:
    site = "/usr/lib/python3.11/site-packages/aiohttp/web_protocol.py"
    assert module_of(site) == "aiohttp/web_protocol.py"
    assert module_of("/work/tree/python/router/core/pipeline.py") == "router/core/pipeline.py"
    assert module_of("/root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/tasks.py") == (
        "asyncio/tasks.py"
    )
    assert module_of("<string>") == "<string>"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stream", [False, True])
def test_a_short_run_counts_every_hop(tmp_path: Path, stream: bool) -> None:
    out = tmp_path / "counts.json"
    args = ["--requests", "5", "--warmup", "2", "--baseline", ".", "--json", str(out)]
    # Streams listed per function, whole answers per module.
    by = "function" if stream else "module"
    table = run_bench("opcodes", *args, "--by", by, *(["--stream"] if stream else []))
    assert f"| {by} (critical) |" in table
    assert "| critical |" in table
    assert "| whole |" in table
    counts = json.loads(out.read_text())
    assert sorted(counts) == ["router", "router-core", "router-core@base", "router@base"]
    for hop in counts.values():
        assert hop["requests"] == 5
        # The first write to the client comes before the request's end.
        assert 0 < hop["total"]["critical"] < hop["total"]["whole"]
        assert hop["modules"]["critical"]["router/core/pipeline.py"] > 0
        assert hop["functions"]["critical"]["router/core/pipeline.py:handle"] > 0
        assert sum(hop["functions"]["whole"].values()) == pytest.approx(hop["total"]["whole"])
    # The features run on top of the same pipeline: the router runs more of it than its core.
    assert counts["router"]["total"]["whole"] > counts["router-core"]["total"]["whole"]
    assert "router/routing/runtime.py" not in counts["router-core"]["modules"]["whole"]
