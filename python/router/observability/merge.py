"""One machine's view from its workers' views: Prometheus expositions and status feeds merged."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Gauges that add up across workers (each worker holds its own share); every other gauge is a
# per-worker view of shared facts (region health, rolling SLO figures) and keeps a `worker`
# label rather than being averaged into something no worker measured.
_SUMMED_GAUGES = frozenset(
    {
        "router_region_in_flight",
        "router_region_queue_depth",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
    }
)
# The same in every worker: reported once.
_SAME_GAUGES = frozenset({"router_build_info"})
# Counters each worker reads from the machine's shared tables (the one prober's ejections):
# every worker reports the machine's count, so the most any reports is the machine's, and a
# dead worker's copy is not kept.
_SHARED_COUNTERS = frozenset({"router_region_ejections"})
# Per process, meaningless summed: dropped.
_DROPPED = frozenset({"process_start_time_seconds", "process_max_fds"})


def _render_value(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}.0"
    return repr(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _head(name: str, kind: str, doc: str) -> list[str]:
    """HELP and TYPE lines under the name the samples carry: the parser strips a counter's
    `_total` from its family name, and prometheus-client's own exposition puts it back."""
    if kind == "counter":
        name += "_total"
    return [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


# What only grows: kept from a worker that died, so the machine's sums never go down.
_MONOTONIC = frozenset({"counter", "histogram", "summary"})


def monotonic_only(text: str) -> str:
    """An exposition's counters, histograms and summaries (its gauges dropped): a dead
    worker's last figures, added to the machine's sums from then on (a sum that went down
    would read as a counter reset and spike every rate())."""
    out: list[str] = []
    for family in text_string_to_metric_families(text):
        if family.type not in _MONOTONIC or family.name in _DROPPED | _SHARED_COUNTERS:
            continue
        out += _head(family.name, family.type, family.documentation)
        for sample in family.samples:
            out.append(f"{sample.name}{_labels(sample.labels)} {_render_value(sample.value)}")
    return "\n".join(out) + "\n" if out else ""


def merge_metrics(texts: Sequence[str], extra: str = "") -> str:
    """Worker expositions -> one: counters and histograms summed per series, additive gauges
    summed, identical gauges once, other gauges per worker (label `worker`)."""
    order: list[str] = []
    meta: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for index, text in enumerate([*texts, extra]):
        if not text:
            continue
        for family in text_string_to_metric_families(text):
            if family.name in _DROPPED:
                continue
            if family.name not in meta:
                order.append(family.name)
                meta[family.name] = (family.type, family.documentation)
                values[family.name] = {}
            series = values[family.name]
            per_worker = family.type in ("gauge", "unknown") and not (
                family.name in _SUMMED_GAUGES or family.name in _SAME_GAUGES
            )
            for sample in family.samples:
                labels = dict(sample.labels)
                if per_worker and index < len(texts):
                    labels["worker"] = str(index)
                key = (sample.name, tuple(labels.items()))
                if family.name in _SAME_GAUGES:
                    series[key] = sample.value
                elif family.name in _SHARED_COUNTERS:
                    series[key] = max(series.get(key, 0.0), sample.value)
                else:
                    series[key] = series.get(key, 0.0) + sample.value
    out: list[str] = []
    for name in order:
        kind, doc = meta[name]
        out += _head(name, kind, doc)
        for (sample_name, label_pairs), value in values[name].items():
            out.append(f"{sample_name}{_labels(dict(label_pairs))} {_render_value(value)}")
    return "\n".join(out) + "\n"


def merge_status(feeds: Sequence[Mapping[str, Any]], workers: int) -> dict[str, Any]:
    """Worker /status.json feeds -> one: counts summed; a region's health as the workers agree
    (healthy only if every worker sees it so); rolling quantiles the worst worker's (an upper
    bound: quantiles of separate samples cannot be merged exactly from the feeds)."""
    if not feeds:
        return {"workers": 0, "regions": []}
    first = feeds[0]
    merged: dict[str, Any] = {
        "ts": max(f.get("ts", 0) for f in feeds),
        "slo": first.get("slo"),
        "workers": workers,
        "overall": _merge_slo([f.get("overall") or {} for f in feeds]),
        "cache": _merge_cache([f.get("cache") or {} for f in feeds]),
        "rate_limited": sum(f.get("rate_limited", 0) for f in feeds),
    }
    regions: dict[str, list[Mapping[str, Any]]] = {}
    for feed in feeds:
        for region in feed.get("regions", []):
            regions.setdefault(region["name"], []).append(region)
    merged["regions"] = [_merge_region(name, views) for name, views in regions.items()]
    return merged


def _merge_slo(views: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    views = list(views)
    requests = sum(v.get("requests", 0) or 0 for v in views)
    errors = sum(v.get("errors", 0) or 0 for v in views)
    out: dict[str, Any] = {
        "requests": requests,
        "errors": errors,
        "error_rate": errors / requests if requests else None,
    }
    for key in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms"):
        known = [v[key] for v in views if v.get(key) is not None]
        out[key] = max(known) if known else None
    for key in ("ttft_ok", "errors_ok"):
        out[key] = all(v.get(key, True) for v in views)
    return out


def _merge_cache(views: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    views = list(views)
    hits = sum(v.get("hits", 0) for v in views)
    misses = sum(v.get("misses", 0) for v in views)
    return {
        "hits": hits,
        "misses": misses,
        "hit_ratio": hits / (hits + misses) if hits + misses else None,
    }


def _merge_region(name: str, views: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    health = [v.get("healthy") for v in views if v.get("healthy") is not None]
    rtts = [v["rtt_ms"] for v in views if v.get("rtt_ms") is not None]
    # A region's errors are its failed attempts (observability.status): a rate of its attempts.
    attempts = sum(v.get("attempts", 0) for v in views)
    errors = sum(v.get("errors", 0) or 0 for v in views)
    return {
        "name": name,
        "healthy": all(health) if health else None,
        "rtt_ms": min(rtts) if rtts else None,
        "in_flight": sum(v.get("in_flight", 0) for v in views),
        "queue_depth": sum(v.get("queue_depth", 0) for v in views),
        "ejections": max(v.get("ejections", 0) for v in views),
        **_merge_slo(views),
        "attempts": attempts,
        "error_rate": errors / attempts if attempts else None,
        "shed": sum(v.get("shed", 0) for v in views),
    }
