"""The load generator's command line: `router bench` and `python -m bench.load`."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import aiohttp
import msgspec
import uvloop

from router.loadgen.origin import origin_delta, origin_requests, parse_origins
from router.loadgen.progress import Progress
from router.loadgen.requests import endpoint_url, round_robin
from router.loadgen.runner import LoadSpec, RunResult, run_load
from router.loadgen.sse import Endpoint
from router.loadgen.summary import summarize

DEFAULT_PROMPT = "Say hello in one short sentence."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The generator's options, shared by both entry points."""
    parser.add_argument(
        "--url", required=True, help="base URL of an OpenAI-compatible API (http://host:port[/v1])"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="sent as a Bearer token (default: $ROUTER_BENCH_API_KEY, $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an extra request header (repeatable), e.g. 'OpenAI-Organization: org-1'",
    )
    parser.add_argument(
        "--model", default="sim-1", help="the model to ask for (default: the sim regions' sim-1)"
    )
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop: workers (default 8); open loop: cap on requests in flight "
        "(default 1024; arrivals over the cap count as client_saturated)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="requests/s with Poisson arrivals (open loop); omit for closed loop",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds (upper bound)")
    parser.add_argument("--count", type=int, default=1000, help="requests (upper bound)")
    parser.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds requests in flight may finish after --duration",
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="a prompt (repeatable; requests cycle through them)",
    )
    parser.add_argument("--prompts-file", type=Path, default=None, help="one prompt per line")
    parser.add_argument("--no-stream", action="store_true", help="ask for whole responses")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Poisson schedule")
    parser.add_argument("--name", default="load", help="run name in the results")
    parser.add_argument(
        "--results", type=Path, default=None, help="folder for results.json, results.md (and plots)"
    )
    parser.add_argument("--plot", action="store_true", help="also write PNG plots (matplotlib)")
    parser.add_argument("--samples", action="store_true", help="also write every sample")
    parser.add_argument(
        "--timeline-bin", type=float, default=1.0, help="seconds per bar of the region plot"
    )
    parser.add_argument(
        "--origin-stats",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="a sim region whose own request counter (GET URL/sim/stats) is read before and "
        "after the run: origin load as the region counts it (repeatable)",
    )
    parser.add_argument("--progress-interval", type=float, default=1.0)
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts: list[str] = list(args.prompt or [])
    if args.prompts_file is not None:
        lines = args.prompts_file.read_text().splitlines()
        from_file = [line for line in lines if line.strip()]
        if not from_file:
            raise ValueError(f"--prompts-file {args.prompts_file} has no prompts")
        prompts += from_file
    return prompts or [DEFAULT_PROMPT]


# RFC 9110 section 5.6.2: a header name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def parse_headers(specs: Sequence[str]) -> dict[str, str]:
    """`Name: value` options -> headers; ValueError names the bad one.

    The name must be an RFC 9110 token and the value must hold no CR, LF or NUL, which would
    end the header early or be refused mid-run by the HTTP client.
    """
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not _TOKEN.fullmatch(name):
            raise ValueError(f"--header wants 'Name: value' with a token Name, got {spec!r}")
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"--header value must not hold CR, LF or NUL, got {spec!r}")
        out[name.lower()] = value
    return out


def _check_options(args: argparse.Namespace) -> None:
    """ValueError for the options LoadSpec does not cover."""
    if not 0 < args.timeline_bin < math.inf:
        raise ValueError("--timeline-bin must be positive and finite")
    if not 0 <= args.progress_interval < math.inf:
        raise ValueError("--progress-interval must be non-negative and finite")
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be >= 1")
    # Before any load: matplotlib is an extra, not a dependency of an installed router.
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'router[plot]'")


def _concurrency(args: argparse.Namespace) -> int:
    if args.concurrency is not None:
        value: int = args.concurrency
        return value
    # Open loop must not be capped by the client at a rate the server could take.
    return 8 if args.rate is None else 1024


def run(args: argparse.Namespace) -> int:
    """Run the load the options describe; print the table; 0 when every request succeeded."""
    endpoint = cast(Endpoint, args.endpoint)
    stream = not args.no_stream
    try:
        url = endpoint_url(args.url, endpoint)
        spec = LoadSpec(
            concurrency=_concurrency(args),
            rate=args.rate,
            duration_s=args.duration,
            max_requests=args.count,
            timeout_s=args.timeout,
            grace_s=args.grace,
            endpoint=endpoint,
            stream=stream,
            seed=args.seed,
        )
        spec.validate()
        _check_options(args)
        prompts = _prompts(args)
        origins = parse_origins(args.origin_stats)
        extra_headers = parse_headers(args.header)
    except (ValueError, OSError) as exc:
        print(f"router bench: {exc}", file=sys.stderr)
        return 2
    if args.results is not None:
        # Before any load: a run is not worth making if its results cannot be kept.
        from router.loadgen.report import prepare_folder

        try:
            prepare_folder(args.results)
        except OSError as exc:
            print(f"router bench: --results {args.results}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    key = args.api_key or os.environ.get("ROUTER_BENCH_API_KEY") or os.environ.get("OPENAI_API_KEY")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    headers.update(extra_headers)
    factory = round_robin(
        url, prompts, model=args.model, endpoint=endpoint, max_tokens=args.max_tokens, stream=stream
    )
    progress = None if args.quiet else Progress(args.name, args.progress_interval)
    # asyncio.run has no loop_factory before 3.12; a Runner does.
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            before = runner.run(origin_requests(origins)) if origins else {}
            result: RunResult = runner.run(
                run_load(args.name, spec, factory, headers=headers, progress=progress)
            )
            after = runner.run(origin_requests(origins)) if origins else {}
    except KeyboardInterrupt:
        print("router bench: interrupted", file=sys.stderr)
        return 130
    except (aiohttp.ClientError, msgspec.DecodeError, TimeoutError) as exc:
        print(f"router bench: --origin-stats: {exc!r}", file=sys.stderr)
        return 2
    config = {
        "url": url,
        "model": args.model,
        "mode": "open" if args.rate else "closed",
        **{f: getattr(spec, f) for f in spec.__struct_fields__},
    }
    summary = summarize(args.name, result.samples, result.wall_s, config=config)
    if origins:
        summary.origin = origin_delta(after, before)
    from router.loadgen.report import markdown_table, write_results

    print(markdown_table([summary]), end="")
    if args.results is not None:
        paths = write_results(
            args.results,
            [summary],
            title=args.name,
            samples={args.name: result.samples} if (args.plot or args.samples) else None,
            plots=args.plot,
            timeline=args.name if args.plot else None,
            timeline_bin_s=args.timeline_bin,
        )
        print("wrote " + " ".join(str(p) for p in paths), file=sys.stderr)
    if summary.sent == 0:
        print("router bench: no request was sent (raise --rate or --duration)", file=sys.stderr)
        return 1
    return 0 if summary.ok == summary.sent else 1


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.load` / `python -m router.loadgen`."""
    parser = argparse.ArgumentParser(
        prog="router bench", description="Load-test an OpenAI-compatible endpoint."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
