"""`router top`: a terminal view of a running router's /status.json."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

_CLEAR = "\x1b[H\x1b[2J"
_COLUMNS = (
    ("region", 12, "<"),
    ("health", 8, "<"),
    ("rtt", 9, ">"),
    ("p50", 9, ">"),
    ("p95", 9, ">"),
    ("in-flight", 9, ">"),
    ("queued", 7, ">"),
    ("errors", 8, ">"),
    ("ejections", 9, ">"),
    ("requests", 9, ">"),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _health(value: bool | None) -> str:
    return "unknown" if value is None else ("up" if value else "DOWN")


def _row(cells: list[str]) -> str:
    return " ".join(
        f"{c:{align}{width}}" for c, (_, width, align) in zip(cells, _COLUMNS, strict=True)
    ).rstrip()


def render(doc: dict[str, Any]) -> str:
    """The status document as a screen of text."""
    o, slo, cache = doc["overall"], doc["slo"], doc["cache"]
    ttft_flag = "ok" if o["ttft_ok"] else "MISSED"
    err_flag = "ok" if o["errors_ok"] else "MISSED"
    stamp = time.strftime("%H:%M:%S", time.localtime(doc["ts"]))
    lines = [
        f"router status at {stamp}   window {slo['window_s']:g}s   requests {o['requests']}",
        f"TTFT p50/p95/p99 {_ms(o['ttft_p50_ms'])} / {_ms(o['ttft_p95_ms'])} / "
        f"{_ms(o['ttft_p99_ms'])}   objective p95 < {_ms(slo['ttft_p95_target_ms'])}: {ttft_flag}",
        f"5xx rate {_pct(o['error_rate'])}   objective < {_pct(slo['error_rate_target'])}: "
        f"{err_flag}   cache hit ratio {_pct(cache['hit_ratio'])}   "
        f"rate-limited {doc['rate_limited']}",
        "",
        _row([name for name, _, _ in _COLUMNS]),
    ]
    for r in doc["regions"]:
        lines.append(
            _row(
                [
                    r["name"],
                    _health(r["healthy"]),
                    _ms(r["rtt_ms"]),
                    _ms(r["ttft_p50_ms"]),
                    _ms(r["ttft_p95_ms"]),
                    str(r["in_flight"]),
                    str(r["queue_depth"]),
                    _pct(r["error_rate"]),
                    str(r["ejections"]),
                    str(r["requests"]),
                ]
            )
        )
    return "\n".join(lines)


def fetch(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """GET {url}/status.json."""
    with urllib.request.urlopen(url.rstrip("/") + "/status.json", timeout=timeout_s) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
        return doc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`router top` options."""
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the router's base URL")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    parser.add_argument("--count", type=int, default=None, help="stop after this many screens")
    parser.add_argument("--once", action="store_true", help="print one screen and exit")


def run(args: argparse.Namespace) -> int:
    """Poll and redraw until --count screens (or Ctrl-C); 1 if the router never answered."""
    count = 1 if args.once else args.count
    interactive = sys.stdout.isatty() and not args.once
    shown = answered = 0
    try:
        while count is None or shown < count:
            try:
                text = render(fetch(args.url))
                answered += 1
            except (OSError, ValueError, KeyError) as exc:
                text = f"router at {args.url} unreachable: {exc}"
            print((_CLEAR if interactive else "") + text, flush=True)
            shown += 1
            if count is None or shown < count:
                time.sleep(max(0.1, args.interval))
    except KeyboardInterrupt:
        pass
    return 0 if answered else 1
