"""An async load generator for OpenAI-compatible endpoints: closed and open loop, streaming."""

from router.loadgen.runner import LoadSpec, RequestFactory, RunResult, run_load
from router.loadgen.sample import Planned, Sample
from router.loadgen.stats import Dist, distribution, percentile
from router.loadgen.summary import Summary, region_timeline, summarize

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
