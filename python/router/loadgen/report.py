"""Result writers: JSON, a markdown table and (only when asked) PNG plots in a results folder."""

from __future__ import annotations

import errno
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from router.loadgen.sample import Sample
from router.loadgen.stats import Dist
from router.loadgen.summary import Summary


def to_json(summaries: Sequence[Summary]) -> bytes:
    """The summaries as indented JSON (one object per run)."""
    return msgspec.json.format(msgspec.json.encode({"runs": list(summaries)}), indent=2) + b"\n"


def _ms(dist: Dist | None, field: str) -> str:
    if dist is None:
        return "-"
    value: float = getattr(dist, field)
    return f"{value:.1f}"


def _counts(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return "-"
    return ", ".join(f"{k}={v}" for k, v in counts.items())


def markdown_table(summaries: Sequence[Summary]) -> str:
    """One row per run: counts, RPS, TTFT/total/ITL percentiles (ms), errors and traffic."""
    header = (
        "| run | sent | ok | ok RPS | TTFT p50 | TTFT p95 | TTFT p99 | TTFT p99.9 | total p50 "
        "| total p95 | ITL p50 | ITL p95 | errors | regions (header) | cache | origin (counted) |"
    )
    rule = "|" + "---|" * (header.count("|") - 1)
    rows = [header, rule]
    for s in summaries:
        rows.append(
            f"| {s.name} | {s.sent} | {s.ok} | {s.ok_rps:.1f} "
            f"| {_ms(s.ttft_ms, 'p50')} | {_ms(s.ttft_ms, 'p95')} | {_ms(s.ttft_ms, 'p99')} "
            f"| {_ms(s.ttft_ms, 'p999')} | {_ms(s.total_ms, 'p50')} | {_ms(s.total_ms, 'p95')} "
            f"| {_ms(s.itl_ms, 'p50')} | {_ms(s.itl_ms, 'p95')} | {_counts(s.errors)} "
            f"| {_counts(s.regions)} | {_counts(s.cache)} | {_counts(s.origin)} |"
        )
    notes = [f"- {s.name}: {n}" for s in summaries for n in s.notes]
    text = "\n".join(rows) + "\n"
    if notes:
        text += "\n" + "\n".join(notes) + "\n"
    return text


def prepare_folder(folder: Path) -> None:
    """Create `folder` and prove a file can be written in it; OSError (with its strerror) if not.

    Called before a run, so an unwritable results folder costs an error line, not the run.
    """
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a folder", str(folder))
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass


def write_results(
    folder: Path,
    summaries: Sequence[Summary],
    *,
    title: str = "load",
    samples: Mapping[str, Sequence[Sample]] | None = None,
    plots: bool = False,
    timeline: str | None = None,
    timeline_bin_s: float = 1.0,
) -> list[Path]:
    """Write results.json, results.md, and with `plots` a TTFT/total CDF and a region timeline."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "results.json", folder / "results.md"]
    written[0].write_bytes(to_json(summaries))
    written[1].write_text(f"# {title}\n\n" + markdown_table(summaries))
    if samples is not None:
        path = folder / "samples.json"
        path.write_bytes(msgspec.json.encode({k: list(v) for k, v in samples.items()}))
        written.append(path)
    if plots and samples is not None:
        # Imported here so that runs without plots never need matplotlib.
        from router.loadgen import plot

        written += plot.cdfs(folder, title, samples)
        if timeline is not None and timeline in samples:
            written.append(
                plot.region_traffic(
                    folder / f"traffic-{timeline}.png", title, samples[timeline], timeline_bin_s
                )
            )
    return written
