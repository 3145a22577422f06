"""Prometheus metrics on a registry per app, fed one AccessRecord per finished request."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from router.accesslog import AccessLog, AccessRecord
from router.quantiles import OVERALL
from router.slo import QUANTILES, SloTracker
from router.timing import STAGES, TOTAL, TTFT

# 1-2-5 steps from 1 ms to 60 s: enough resolution for a 200 ms SLO and for minute-long streams.
_SUB_SECOND = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
LATENCY_BUCKETS = (*_SUB_SECOND, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
# Router-internal stages (auth, a limit check, a cache lookup) take microseconds.
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, *LATENCY_BUCKETS)

# A label value outside the first MAX_LABEL_VALUES seen is folded into OTHER, so a client
# sending random model names cannot grow the registry without bound.
MAX_LABEL_VALUES = 64
OTHER = "_other"
NONE = "none"


@dataclass(frozen=True, slots=True)
class RegionState:
    """One region as the health snapshot sees it at scrape time."""

    region: str
    healthy: bool
    rtt_s: float | None = None
    in_flight: int = 0
    queue_depth: int = 0
    ejections: int = 0


RegionSource = Callable[[], Iterable[RegionState]]


class _Children:
    """Label children pre-resolved for one (region, model, status, cache) combination."""

    __slots__ = ("requests", "total", "ttft")

    def __init__(self, requests: Counter, ttft: Histogram, total: Histogram) -> None:
        self.requests = requests
        self.ttft = ttft
        self.total = total


class _Bounded:
    """Maps label values to themselves until MAX_LABEL_VALUES distinct ones, then to OTHER."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if value is None:
            return NONE
        if value in self._seen:
            return value
        if len(self._seen) >= MAX_LABEL_VALUES:
            return OTHER
        self._seen.add(value)
        return value


class Metrics:
    """The router's Prometheus metrics; `observe` costs a dict lookup and a few increments."""

    def __init__(
        self,
        *,
        slo: SloTracker | None = None,
        regions: RegionSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        labels = ("region", "model", "status", "cache")
        self.requests = Counter("router_requests", "Finished requests.", labels, registry=r)
        self.ttft = Histogram(
            "router_ttft_seconds",
            "Time to first token as the client sees it.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.total = Histogram(
            "router_request_duration_seconds",
            "Total request latency.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stages = Histogram(
            "router_stage_seconds",
            "Time spent per request stage.",
            ("stage",),
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self._stage = {s: self.stages.labels(s) for s in STAGES}
        self.cache_hits = Counter("router_cache_hits", "Cache hits.", registry=r)
        self.cache_misses = Counter("router_cache_misses", "Cache misses.", registry=r)
        self.retries = Counter("router_retries", "Upstream retries.", registry=r)
        self.failovers = Counter("router_failovers", "Failovers to another region.", registry=r)
        self.hedges = Counter("router_hedges", "Hedged requests sent.", registry=r)
        self.rate_limited = Counter("router_rate_limited", "Requests answered 429.", registry=r)
        self.server_errors = Counter(
            "router_server_errors", "Requests answered 5xx.", ("region",), registry=r
        )
        self._children: dict[tuple[str, str, int, str], _Children] = {}
        self._region = _Bounded()
        self._model = _Bounded()
        self.slo = slo
        self._clock = clock
        r.register(_StateCollector(regions, slo, clock))

    def _resolve(self, key: tuple[str, str, int, str]) -> _Children:
        region, model, status, cache = key
        values = (region, model, str(status), cache)
        children = _Children(
            self.requests.labels(*values), self.ttft.labels(*values), self.total.labels(*values)
        )
        self._children[key] = children
        return children

    def observe(self, rec: AccessRecord) -> None:
        """Count one finished request and feed the SLO tracker."""
        key = (self._region(rec.region), self._model(rec.model), rec.status, rec.cache)
        children = self._children.get(key)
        if children is None:
            children = self._resolve(key)
        children.requests.inc()
        stages = rec.stages
        ttft_ns = stages.get(TTFT)
        if ttft_ns is not None:
            children.ttft.observe(ttft_ns / 1e9)
        total_ns = stages.get(TOTAL)
        if total_ns is not None:
            children.total.observe(total_ns / 1e9)
        stage = self._stage
        for name, ns in stages.items():
            child = stage.get(name)
            if child is not None:
                child.observe(ns / 1e9)
        cache = rec.cache
        if cache == "hit":
            self.cache_hits.inc()
        elif cache == "miss":
            self.cache_misses.inc()
        if rec.retries:
            self.retries.inc(rec.retries)
        if rec.failovers:
            self.failovers.inc(rec.failovers)
        if rec.hedges:
            self.hedges.inc(rec.hedges)
        status = rec.status
        if status == 429:
            self.rate_limited.inc()
        elif status >= 500:
            self.server_errors.labels(self._region(rec.region)).inc()
        if self.slo is not None:
            ttft_s = None if ttft_ns is None else ttft_ns / 1e9
            self.slo.observe(rec.region, status, ttft_s, self._clock())

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _StateCollector(Collector):
    """Gauges read at scrape time: region health from the snapshot, rolling SLO figures."""

    def __init__(
        self, regions: RegionSource | None, slo: SloTracker | None, clock: Callable[[], float]
    ) -> None:
        self._regions = regions
        self._slo = slo
        self._clock = clock

    def describe(self) -> Iterable[Metric]:
        # Describing nothing keeps registration from calling collect() before the app is up.
        return []

    def collect(self) -> Iterator[Metric]:
        if self._regions is not None:
            yield from _region_families(list(self._regions()))
        if self._slo is not None:
            yield from _slo_families(self._slo, self._clock())


def _region_families(states: list[RegionState]) -> Iterator[Metric]:
    healthy = GaugeMetricFamily(
        "router_region_healthy", "1 if the region takes traffic.", labels=["region"]
    )
    rtt = GaugeMetricFamily(
        "router_region_rtt_seconds", "EWMA of the health probe RTT.", labels=["region"]
    )
    in_flight = GaugeMetricFamily(
        "router_region_in_flight", "Requests in flight to the region.", labels=["region"]
    )
    queue = GaugeMetricFamily(
        "router_region_queue_depth", "Requests waiting for admission.", labels=["region"]
    )
    ejections = CounterMetricFamily(
        "router_region_ejections", "Times the region was ejected.", labels=["region"]
    )
    for s in states:
        healthy.add_metric([s.region], 1.0 if s.healthy else 0.0)
        if s.rtt_s is not None:
            rtt.add_metric([s.region], s.rtt_s)
        in_flight.add_metric([s.region], float(s.in_flight))
        queue.add_metric([s.region], float(s.queue_depth))
        ejections.add_metric([s.region], float(s.ejections))
    yield from (healthy, rtt, in_flight, queue, ejections)


def _slo_families(slo: SloTracker, now: float) -> Iterator[Metric]:
    t = slo.targets
    yield GaugeMetricFamily(
        "router_slo_ttft_p95_target_seconds", "TTFT p95 objective.", value=t.ttft_p95_s
    )
    yield GaugeMetricFamily(
        "router_slo_error_rate_target", "Error rate objective.", value=t.error_rate
    )
    rolling = GaugeMetricFamily(
        "router_ttft_rolling_seconds",
        f"Rolling TTFT quantiles over {t.window_s:g} s.",
        labels=["region", "quantile"],
    )
    errors = GaugeMetricFamily("router_error_rate_rolling", "Rolling 5xx ratio.", labels=["region"])
    ok = GaugeMetricFamily(
        "router_slo_compliant",
        "1 if the objective is met over the window.",
        labels=["region", "objective"],
    )
    for st in slo.report(now):
        region = "all" if st.key == OVERALL else st.key
        for q, v in zip(QUANTILES, (st.ttft_p50_s, st.ttft_p95_s, st.ttft_p99_s), strict=True):
            if v is not None:
                rolling.add_metric([region, f"{q:g}"], v)
        if st.error_rate is not None:
            errors.add_metric([region], st.error_rate)
        ok.add_metric([region, "ttft_p95"], 1.0 if st.ttft_ok else 0.0)
        ok.add_metric([region, "error_rate"], 1.0 if st.errors_ok else 0.0)
    yield from (rolling, errors, ok)


class Telemetry:
    """Everything a finished request feeds: Prometheus metrics, SLO tracker, access log."""

    __slots__ = ("log", "metrics", "regions", "slo")

    def __init__(
        self,
        *,
        slo: SloTracker | None = None,
        regions: RegionSource | None = None,
        log: AccessLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slo = slo if slo is not None else SloTracker()
        self.regions = regions
        self.metrics = Metrics(slo=self.slo, regions=regions, clock=clock)
        self.log = log

    def finish(self, rec: AccessRecord) -> None:
        """Record one finished request everywhere."""
        self.metrics.observe(rec)
        if self.log is not None:
            self.log.emit(rec)
