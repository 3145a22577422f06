"""The load generator; it lives in `router.loadgen` so the installed `router bench` has it too."""

from router.loadgen import (
    Dist,
    LoadSpec,
    Planned,
    RequestFactory,
    RunResult,
    Sample,
    Summary,
    distribution,
    percentile,
    region_timeline,
    run_load,
    summarize,
)

__all__ = [
    "Dist",
    "LoadSpec",
    "Planned",
    "RequestFactory",
    "RunResult",
    "Sample",
    "Summary",
    "distribution",
    "percentile",
    "region_timeline",
    "run_load",
    "summarize",
]
