"""Prometheus metrics on a registry per app, fed one AccessRecord per finished request."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from router.core.timing import STAGES, TOTAL, TTFT
from router.observability.access_log import AccessLog, AccessRecord
from router.observability.quantiles import OVERALL
from router.observability.region_attempts import RegionAttempts
from router.observability.slo import QUANTILES, SloTracker

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
    healthy: bool | None  # None: not known yet
    rtt_s: float | None = None
    in_flight: int = 0
    queue_depth: int = 0
    ejections: int = 0


RegionSource = Callable[[], Iterable[RegionState]]


class _Histogram:
    """A histogram over nanosecond values; plain ints, one event loop, so no locks."""

    __slots__ = ("bounds", "counts", "sum_ns")

    def __init__(self, bounds_ns: tuple[int, ...]) -> None:
        self.bounds = bounds_ns
        self.counts = [0] * (len(bounds_ns) + 1)
        self.sum_ns = 0

    def observe(self, ns: int) -> None:
        # bisect_left puts a value equal to a bound in that bound's bucket, as `le` means.
        self.counts[bisect_left(self.bounds, ns)] += 1
        self.sum_ns += ns

    def buckets(self, les: tuple[str, ...]) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs ending with +Inf."""
        out: list[tuple[str, float]] = []
        running = 0
        for le, n in zip(les, self.counts, strict=True):
            running += n
            out.append((le, float(running)))
        return out


def _ns(bounds_s: tuple[float, ...]) -> tuple[int, ...]:
    return tuple(round(b * 1e9) for b in bounds_s)


def _les(bounds_s: tuple[float, ...]) -> tuple[str, ...]:
    # repr matches prometheus-client's own `le` strings for these bounds ("0.001", "60.0").
    return (*(repr(float(b)) for b in bounds_s), "+Inf")


_LATENCY_NS = _ns(LATENCY_BUCKETS)
_STAGE_NS = _ns(STAGE_BUCKETS)


class _Series:
    """The request counter and latency histograms of one (region, model, status, cache)."""

    __slots__ = ("requests", "total", "ttft")

    def __init__(self) -> None:
        self.requests = 0
        self.ttft = _Histogram(_LATENCY_NS)
        self.total = _Histogram(_LATENCY_NS)


class _Bounded:
    """Maps label values to themselves until MAX_LABEL_VALUES distinct ones, then to OTHER.

    With `known` values given, anything else is OTHER at once: a client naming models that do
    not exist must not use up the label space the served models need.
    """

    __slots__ = ("_known", "_seen")

    def __init__(self, known: Iterable[str] | None = None) -> None:
        self._known = None if known is None else frozenset(known)
        self._seen: set[str] = set()

    def know(self, values: Iterable[str]) -> None:
        """Also take `values` (models a reload added); those known before stay known, since
        their series are still there."""
        if self._known is not None:
            self._known = self._known | frozenset(values)

    def __call__(self, value: str | None) -> str:
        if value is None:
            return NONE
        if value in self._seen:
            return value
        if len(self._seen) >= MAX_LABEL_VALUES or (
            self._known is not None and value not in self._known
        ):
            return OTHER
        self._seen.add(value)
        return value


class _TenantCounts:
    """Requests, tokens and 429s of one tenant."""

    __slots__ = ("rate_limited", "requests", "tokens_in", "tokens_out")

    def __init__(self) -> None:
        self.requests = 0
        self.tokens_in = 0
        self.tokens_out = 0
        self.rate_limited = 0


class Metrics:
    """The router's Prometheus metrics; `observe` is a dict lookup and a few int increments.

    prometheus-client's own metric objects take a lock and cost ~1 us per observation; a
    request makes a dozen, so the hot path keeps plain counters and a collector renders them.
    """

    def __init__(
        self,
        *,
        slo: SloTracker | None = None,
        regions: RegionSource | None = None,
        models: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        build: tuple[str, str] | None = None,
        generation: Callable[[], int] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.series: dict[tuple[str, str, int, str], _Series] = {}
        self.tenants: dict[str, _TenantCounts] = {}
        # (model, region) -> [prompt tokens, completion tokens], from answers that report usage.
        self.tokens: dict[tuple[str, str], list[int]] = {}
        self._tenant = _Bounded()
        self.stages = {s: _Histogram(_STAGE_NS) for s in STAGES}
        self.cache_hits = 0
        self.cache_misses = 0
        self.retries = 0
        self.failovers = 0
        self.hedges = 0
        self.rate_limited = 0
        self.server_errors: dict[str, int] = {}
        # Streams the router ended with a failure event (status 200, answer incomplete).
        self.stream_failures: dict[tuple[str, str], int] = {}
        self._region = _Bounded()
        self._model = _Bounded(models)
        self.slo = slo
        # Every attempt at a region by its outcome, apart from the requests (a failover is one
        # request but attempts at two regions); the status page's per-region errors.
        self.attempts = RegionAttempts(slo.targets.window_s if slo is not None else 300.0)
        self._clock = clock
        self.registry.register(_RequestCollector(self))
        self.registry.register(_StateCollector(regions, slo, clock))
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        ProcessCollector(registry=self.registry)
        # python_gc_collections_total / _objects_collected_total / _objects_uncollectable_total
        # {generation}: a request path that leaves reference cycles shows as collected objects.
        GCCollector(registry=self.registry)
        self.registry.register(_BuildCollector(build, generation))

    def observe(self, rec: AccessRecord) -> None:
        """Count one finished request and feed the SLO tracker."""
        # The router's own refusal (admission full everywhere) is no region's answer.
        answered_by = None if rec.refused else rec.region
        region = self._region(answered_by)
        key = (region, self._model(rec.model), rec.status, rec.cache)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = _Series()
        series.requests += 1
        stages = rec.stages
        ttft_ns = stages.get(TTFT)
        if ttft_ns is not None:
            series.ttft.observe(ttft_ns)
        total_ns = stages.get(TOTAL)
        if total_ns is not None:
            series.total.observe(total_ns)
        hists = self.stages
        for name, ns in stages.items():
            hist = hists.get(name)
            if hist is not None:
                hist.observe(ns)
        cache = rec.cache
        if cache == "hit":
            self.cache_hits += 1
        elif cache == "miss":
            self.cache_misses += 1
        self.retries += rec.retries
        self.failovers += rec.failovers
        self.hedges += rec.hedges
        status = rec.status
        # The router's own shutdown ended it: no region's failure, no objective's either.
        drained = rec.drained
        if status == 429:
            self.rate_limited += 1
        elif status >= 500 and not drained:
            self.server_errors[region] = self.server_errors.get(region, 0) + 1
        broken = rec.error is not None and not drained
        if broken:
            pair = (region, key[1])
            self.stream_failures[pair] = self.stream_failures.get(pair, 0) + 1
        tenant = self._tenant(rec.tenant)
        counts = self.tenants.get(tenant)
        if counts is None:
            counts = self.tenants[tenant] = _TenantCounts()
        counts.requests += 1
        if status == 429:
            counts.rate_limited += 1
        tokens_in, tokens_out = rec.tokens_in, rec.tokens_out
        if tokens_in is not None or tokens_out is not None:
            counts.tokens_in += tokens_in or 0
            counts.tokens_out += tokens_out or 0
            pair = (key[1], region)
            spent = self.tokens.get(pair)
            if spent is None:
                spent = self.tokens[pair] = [0, 0]
            spent[0] += tokens_in or 0
            spent[1] += tokens_out or 0
        if self.slo is not None and not drained:
            ttft_s = None if ttft_ns is None else ttft_ns / 1e9
            self.slo.observe(answered_by, status, ttft_s, self._clock(), broken=broken)

    def attempt(self, region: str, outcome: str) -> None:
        """Count one attempt at `region` (a configured region's name) by its outcome
        (region_attempts.outcome_of, or BROKEN)."""
        self.attempts.add(self._region(region), outcome, self._clock())

    def know_models(self, models: Iterable[str]) -> None:
        """Models a reload made servable get their own label value, not `_other`."""
        self._model.know(models)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_LABELS = ["region", "model", "status", "cache"]


class _RequestCollector(Collector):
    """Renders the hot-path counters and histograms of a Metrics at scrape time."""

    def __init__(self, m: Metrics) -> None:
        self._m = m
        self._latency_les = _les(LATENCY_BUCKETS)
        self._stage_les = _les(STAGE_BUCKETS)

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        m = self._m
        requests = CounterMetricFamily("router_requests", "Finished requests.", labels=_LABELS)
        ttft = HistogramMetricFamily(
            "router_ttft_seconds", "Time to first token as the client sees it.", labels=_LABELS
        )
        total = HistogramMetricFamily(
            "router_request_duration_seconds", "Total request latency.", labels=_LABELS
        )
        for (region, model, status, cache), series in m.series.items():
            values = [region, model, str(status), cache]
            requests.add_metric(values, float(series.requests))
            for fam, hist in ((ttft, series.ttft), (total, series.total)):
                if any(hist.counts):
                    fam.add_metric(values, hist.buckets(self._latency_les), hist.sum_ns / 1e9)
        stages = HistogramMetricFamily(
            "router_stage_seconds", "Time spent per request stage.", labels=["stage"]
        )
        for name, hist in m.stages.items():
            stages.add_metric([name], hist.buckets(self._stage_les), hist.sum_ns / 1e9)
        yield from (requests, ttft, total, stages)
        for name, doc, value in (
            ("router_cache_hits", "Cache hits.", m.cache_hits),
            ("router_cache_misses", "Cache misses.", m.cache_misses),
            ("router_retries", "Upstream retries.", m.retries),
            ("router_failovers", "Failovers to another region.", m.failovers),
            ("router_hedges", "Hedged requests sent.", m.hedges),
            ("router_rate_limited", "Requests answered 429.", m.rate_limited),
        ):
            yield CounterMetricFamily(name, doc, value=float(value))
        errors = CounterMetricFamily(
            "router_server_errors", "Requests answered 5xx.", labels=["region"]
        )
        for region, n in m.server_errors.items():
            errors.add_metric([region], float(n))
        yield errors
        broken = CounterMetricFamily(
            "router_stream_failures",
            "Streams ended with a failure event after their 200 (the answer is incomplete).",
            labels=["region", "model"],
        )
        for (region, model), n in m.stream_failures.items():
            broken.add_metric([region, model], float(n))
        yield broken
        attempts = CounterMetricFamily(
            "router_region_attempts",
            "Attempts at each region (first tries, failovers, retries, hedges, continuations) "
            "by outcome: ok, or why it failed; spill: the router's admission refused it, "
            "never sent.",
            labels=["region", "outcome"],
        )
        for (region, outcome), n in m.attempts.counts.items():
            attempts.add_metric([region, outcome], float(n))
        yield attempts
        yield from _tenant_families(m)


def _tenant_families(m: Metrics) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "router_tenant_requests", "Finished requests per tenant.", labels=["tenant"]
    )
    tokens = CounterMetricFamily(
        "router_tenant_tokens",
        "Tokens per tenant as answers report them (direction: in = prompt, out = completion).",
        labels=["tenant", "direction"],
    )
    limited = CounterMetricFamily(
        "router_tenant_rate_limited", "Requests answered 429 per tenant.", labels=["tenant"]
    )
    for tenant, c in m.tenants.items():
        requests.add_metric([tenant], float(c.requests))
        tokens.add_metric([tenant, "in"], float(c.tokens_in))
        tokens.add_metric([tenant, "out"], float(c.tokens_out))
        limited.add_metric([tenant], float(c.rate_limited))
    by_model = CounterMetricFamily(
        "router_tokens",
        "Tokens per model and region as answers report them.",
        labels=["model", "region", "direction"],
    )
    for (model, region), (tokens_in, tokens_out) in m.tokens.items():
        by_model.add_metric([model, region, "in"], float(tokens_in))
        by_model.add_metric([model, region, "out"], float(tokens_out))
    yield from (requests, tokens, limited, by_model)


class _BuildCollector(Collector):
    """router_build_info{version, commit} and the config generation in force."""

    def __init__(self, build: tuple[str, str] | None, generation: Callable[[], int] | None) -> None:
        self._build = build
        self.generation = generation

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        if self._build is not None:
            info = GaugeMetricFamily(
                "router_build_info",
                "Always 1; the labels say what runs.",
                labels=["version", "commit"],
            )
            info.add_metric(list(self._build), 1.0)
            yield info
        if self.generation is not None:
            yield GaugeMetricFamily(
                "router_config_generation",
                "Config reloads applied since start (0: the file read at start).",
                value=float(self.generation()),
            )


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
        if s.healthy is not None:
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
    errors = GaugeMetricFamily(
        "router_error_rate_rolling",
        "Rolling error ratio: 5xx, regions' 429s passed on, streams ended by a failure event.",
        labels=["region"],
    )
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

    __slots__ = ("generation", "log", "metrics", "regions", "slo")

    def __init__(
        self,
        *,
        slo: SloTracker | None = None,
        regions: RegionSource | None = None,
        log: AccessLog | None = None,
        models: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        build: tuple[str, str] | None = None,
    ) -> None:
        self.slo = slo if slo is not None else SloTracker()
        # Replaceable after startup (the health feature's snapshot); scrapes read it each time.
        self.regions = regions
        self.generation: Callable[[], int] | None = None
        self.metrics = Metrics(
            slo=self.slo,
            regions=self._regions,
            models=models,
            clock=clock,
            build=build,
            generation=self._generation,
        )
        self.log = log

    def _regions(self) -> Iterable[RegionState]:
        return self.regions() if self.regions is not None else ()

    def _generation(self) -> int:
        return self.generation() if self.generation is not None else 0

    def finish(self, rec: AccessRecord) -> None:
        """Record one finished request everywhere."""
        self.metrics.observe(rec)
        if self.log is not None:
            self.log.emit(rec)


def add_routes(app: web.Application, telemetry: Telemetry) -> None:
    """Serve the Prometheus text exposition at `/metrics`."""

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = telemetry.metrics.exposition()
        # aiohttp wants the charset apart from the media type.
        media, _, params = content_type.partition(";")
        charset = params.partition("charset=")[2] or "utf-8"
        return web.Response(body=body, content_type=media.strip(), charset=charset)

    app.router.add_get("/metrics", metrics)
