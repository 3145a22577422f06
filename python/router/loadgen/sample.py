"""What one request measured, and the request the generator plans to send."""

from __future__ import annotations

import msgspec


class Planned(msgspec.Struct, frozen=True, kw_only=True):
    """One request to send: the endpoint URL, the JSON body and a label to group results by."""

    url: str
    body: bytes
    label: str = ""


class Sample(msgspec.Struct, kw_only=True):
    """The measurements of one request; times in seconds."""

    start_s: float  # offset from the run's start; in open loop, the scheduled send time
    total_s: float
    ttft_s: float | None = None  # first content token (streaming only)
    itl_s: list[float] = []  # gaps between successive content chunks
    chunks: int = 0  # content-bearing chunks received
    status: int = 0  # HTTP status, 0 when no response arrived
    error: str | None = None  # kind of failure, None for success
    region: str | None = None  # x-router-region: which origin served it
    cache: str | None = None  # x-cache (or x-router-cache), lower-cased: hit, miss, ...
    label: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None
