"""Origin load as the regions count it: a sim region's GET /sim/stats, before and after a run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aiohttp
import msgspec


class _Stats(msgspec.Struct):
    requests: int


_stats = msgspec.json.Decoder(_Stats)


def parse_origins(specs: Sequence[str]) -> dict[str, str]:
    """`NAME=URL` options -> {name: base URL}; ValueError names the bad one."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"--origin-stats wants NAME=http://host:port, got {spec!r}")
        out[name] = url.rstrip("/")
    return out


async def origin_requests(origins: Mapping[str, str], timeout_s: float = 5.0) -> dict[str, int]:
    """Requests each origin has counted so far."""
    counts: dict[str, int] = {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for name, url in origins.items():
            async with session.get(f"{url}/sim/stats") as resp:
                resp.raise_for_status()
                counts[name] = _stats.decode(await resp.read()).requests
    return counts


def origin_delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Per-origin requests between two snapshots."""
    return {name: after[name] - before.get(name, 0) for name in after}
