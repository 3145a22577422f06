"""PNG plots with matplotlib's Agg backend: latency CDFs and traffic per region over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from router.loadgen.sample import Sample
from router.loadgen.summary import region_timeline


def latency_cdf(
    path: Path,
    title: str,
    series: Mapping[str, Sequence[float]],
    xlabel: str,
    ylabel: str = "fraction of requests",
) -> Path:
    """One empirical CDF line per named series of milliseconds."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in series.items():
        xs = sorted(values)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{name} (n={len(xs)})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.0)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cdfs(folder: Path, title: str, samples: Mapping[str, Sequence[Sample]]) -> list[Path]:
    """TTFT (when streamed) and total latency CDFs of successful requests, per run."""
    out: list[Path] = []
    ttft = {
        name: [s.ttft_s * 1000 for s in runs if s.ok and s.ttft_s is not None]
        for name, runs in samples.items()
    }
    if any(ttft.values()):
        out.append(latency_cdf(folder / "ttft-cdf.png", f"{title}: TTFT", ttft, "TTFT (ms)"))
    total = {name: [s.total_s * 1000 for s in runs if s.ok] for name, runs in samples.items()}
    if any(total.values()):
        out.append(
            latency_cdf(folder / "total-cdf.png", f"{title}: total latency", total, "total (ms)")
        )
    return out


def region_traffic(path: Path, title: str, samples: Sequence[Sample], bin_s: float) -> Path:
    """Stacked successful requests per region per time bin, e.g. across a failover."""
    starts, series = region_timeline(samples, bin_s)
    fig, ax = plt.subplots(figsize=(8, 4))
    if starts:
        # A closing edge, so the last bin is drawn as wide as the others.
        edges = [*starts, starts[-1] + bin_s]
        rows = [[*counts, counts[-1]] for counts in series.values()]
        ax.stackplot(edges, *rows, labels=list(series), step="post")
        ax.legend(loc="upper right", fontsize="small")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel(f"requests started per {bin_s:g}s")
    ax.set_title(f"{title}: traffic per region")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
