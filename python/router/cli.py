"""The `router` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from router import __version__

if TYPE_CHECKING:
    from router.config import Config


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per job."""
    parser = argparse.ArgumentParser(
        prog="router",
        description="Multi-region failover router for OpenAI-compatible LLM inference.",
    )
    parser.add_argument("--version", action="version", version=f"router {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_core(commands)
    hash_key = commands.add_parser(
        "hash-key", help="print the SHA-256 hex of an API key, for [[auth.keys]] sha256"
    )
    hash_key.add_argument("key", nargs="?", help="the key (read from stdin when omitted)")
    hash_key.set_defaults(handler=_hash_key)
    keygen = commands.add_parser(
        "keygen", help="print a new random API key (or admin token) and its SHA-256 for config"
    )
    keygen.add_argument("--prefix", default="sk-router-", help="text before the random part")
    keygen.set_defaults(handler=_keygen)
    _add_bench(commands)
    _add_top(commands)
    return parser


def _add_top(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`router top`: a terminal view of a running router's /status.json."""
    from router.observability import top

    view = commands.add_parser("top", help="watch a running router's status in the terminal")
    top.add_arguments(view)
    view.set_defaults(handler=top.run)


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`router bench`: the load generator (router.loadgen; never imports matplotlib unasked)."""
    from router.loadgen import cli as loadgen_cli

    bench = commands.add_parser(
        "bench", help="load-test an OpenAI-compatible endpoint (closed or open loop)"
    )
    loadgen_cli.add_arguments(bench)
    bench.set_defaults(handler=loadgen_cli.run)


def _hash_key(args: argparse.Namespace) -> int:
    """`router hash-key [KEY]`: the hash to put in config instead of the key itself."""
    from router.access.auth import hash_key

    key = (args.key if args.key is not None else sys.stdin.readline()).strip()
    if not key:
        print("router hash-key: no key given (argument or stdin)", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


def _keygen(args: argparse.Namespace) -> int:
    """`router keygen`: a key to hand out, and the line that goes in config instead of it."""
    import secrets

    from router.access.auth import hash_key

    key = args.prefix + secrets.token_urlsafe(32)
    print(f"key:    {key}")
    print(f"sha256: {hash_key(key)}")
    print(f'config: sha256 = "{hash_key(key)}"   # in [[auth.keys]], or admin_token_sha256')
    return 0


def _add_core(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`serve`, `check-config`, `sim-region`, `demo`: the router core's commands."""
    serve = commands.add_parser("serve", help="run the router with a config file")
    serve.add_argument("--config", required=True, metavar="FILE", help="TOML config file")
    serve.add_argument(
        "--workers",
        metavar="N",
        help='worker processes sharing the listeners ("auto": one per usable CPU); '
        "overrides [server] workers",
    )
    # Set by the supervisor on the workers it starts: INDEX:GENERATION:PID (its own), and its
    # private directory.
    serve.add_argument("--worker", help=argparse.SUPPRESS)
    serve.add_argument("--machine-dir", help=argparse.SUPPRESS)
    serve.set_defaults(handler=_serve)
    check = commands.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("file", metavar="FILE")
    check.set_defaults(handler=_check_config)
    sim = commands.add_parser("sim-region", help="run a simulated OpenAI-compatible region")
    sim.add_argument("--port", type=int, required=True)
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--name", default="sim")
    sim.add_argument("--models", default="sim-1", help="comma-separated model names to list")
    sim.add_argument("--rtt-ms", type=float, default=0.0, help="added before each response")
    sim.add_argument("--ttft-ms", type=float, default=0.0, help="time to first token")
    sim.add_argument("--tokens-per-s", type=float, default=0.0, help="0: as fast as possible")
    sim.add_argument(
        "--fail-mode",
        default="none",
        help="none|refuse|500|503|429|hang|die-mid-stream|drip|error-event|failed-event",
    )
    sim.add_argument(
        "--after-tokens", type=int, default=3, help="tokens before die/hang/error-event"
    )
    sim.add_argument(
        "--error-kind",
        default="server",
        help="error-event's error: server|overloaded|rate_limit|invalid_request",
    )
    sim.add_argument("--drip-ms", type=float, default=1000.0, help="pause between drips")
    sim.add_argument(
        "--kind",
        default="vllm",
        help="the real server to behave like: vllm|llama-server|llama-cpp-python",
    )
    sim.add_argument(
        "--unserved",
        default="",
        help="comma-separated models it answers as vLLM does one it does not serve (404)",
    )
    sim.add_argument(
        "--sse-line-end",
        default="lf",
        help="how its streams end SSE lines: lf|crlf|cr (a lone CR, legal SSE too)",
    )
    sim.add_argument(
        "--sse-fields",
        default="none",
        help="SSE fields besides data: none|all (a comment, retry:, id: and event: lines)",
    )
    sim.set_defaults(handler=_sim_region)
    demo = commands.add_parser("demo", help="three simulated regions and the router in front")
    demo.add_argument("--port", type=int, default=0, help="router port (0: a free one)")
    demo.set_defaults(handler=_demo)


def _load_config(path: str) -> tuple[Config, str] | None:
    """The config at `path` and the text it was decoded from; None (the error printed) if bad."""
    import os

    from router.config import loads, read
    from router.errors import ConfigError

    try:
        text = read(path)
        return loads(text, str(Path(path)), os.environ), text
    except ConfigError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    """`router serve --config FILE`: exit 2 for a bad config, 1 when it cannot start (one line on
    stderr, no traceback: a port in use, a certificate that will not load)."""
    from router.errors import ConfigError, StartupError
    from router.observability import logs
    from router.server import parent, snapshot
    from router.server.app import check
    from router.server.run import Worker, serve
    from router.server.supervisor import cpu_count, supervise

    loaded = _load_config(args.config)
    if loaded is None:
        return 2
    config, text = loaded
    wanted = args.workers if args.workers is not None else config.server.workers
    if wanted == "auto":
        workers = min(cpu_count(), 64)
    elif isinstance(wanted, int) or (
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
        isinstance(wanted, str) and wanted.isascii() and wanted.isdigit()
    ):
        workers = int(wanted)
    else:
        workers = 0
    if not 1 <= workers <= 64:
        print(f'router serve: --workers must be 1 to 64 or "auto", got {wanted!r}',
              file=sys.stderr)  # fmt: skip
        return 2
    logs.configure(config.observability.log_level, config.observability.log_format)
    try:
        if args.worker is not None:
            # INDEX:GENERATION:SUPERVISOR_PID
            index, generation, supervisor = map(int, [*args.worker.split(":"), 0, 0][:3])
            if supervisor:
                parent.follow(supervisor)
            # The generation of the snapshot it read, not the one it was started at: a reload
            # may have come in between.
            read_generation = snapshot.generation(text)
            if read_generation is not None:
                generation = read_generation
            worker = Worker(index, generation, args.machine_dir)
            serve(config, Path(args.config), worker)
            if parent.orphaned() and args.machine_dir:
                parent.clean_up(args.machine_dir)
        elif workers > 1:
            # Once, before any worker starts, rather than in each of them as they fail.
            try:
                check(config)
            except ConfigError as exc:
                raise ConfigError(f"{args.config}: {exc}") from None
            return supervise(config, Path(args.config), workers, text)
        else:
            serve(config, Path(args.config))
    except ConfigError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 1
    return 0


def _check_config(args: argparse.Namespace) -> int:
    """`router check-config FILE`: exit 0 and a summary, or 2 and the error."""
    from router.errors import ConfigError
    from router.server.app import check
    from router.server.tls import Listeners

    loaded = _load_config(args.file)
    if loaded is None:
        return 2
    config = loaded[0]
    try:
        check(config)
        # The certificate files load here as `serve` loads them (which refuses to start).
        Listeners(config)
    except ConfigError as exc:
        print(f"router: {args.file}: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(r.name for r in config.regions)
    print(
        f"{args.file}: ok ({len(config.regions)} regions: {names}; "
        f"models: {', '.join(config.served_models())})"
    )
    return 0


def _sim_region(args: argparse.Namespace) -> int:
    """`router sim-region --port P --name N ...`."""
    import uvloop

    from router.sim.server import (
        ERROR_KINDS,
        FAIL_MODES,
        KINDS,
        LINE_ENDS,
        SSE_FIELDS,
        SimOptions,
        serve_sim,
    )

    if args.fail_mode not in FAIL_MODES:
        print(
            f"router sim-region: --fail-mode must be one of {', '.join(FAIL_MODES)}",
            file=sys.stderr,
        )
        return 2
    if args.error_kind not in ERROR_KINDS:
        print(
            f"router sim-region: --error-kind must be one of {', '.join(ERROR_KINDS)}",
            file=sys.stderr,
        )
        return 2
    if args.kind not in KINDS:
        print(f"router sim-region: --kind must be one of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    if args.sse_line_end not in LINE_ENDS:
        ends = ", ".join(LINE_ENDS)
        print(f"router sim-region: --sse-line-end must be one of {ends}", file=sys.stderr)
        return 2
    if args.sse_fields not in SSE_FIELDS:
        fields = ", ".join(SSE_FIELDS)
        print(f"router sim-region: --sse-fields must be one of {fields}", file=sys.stderr)
        return 2
    options = SimOptions(
        name=args.name,
        models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
        rtt_ms=args.rtt_ms,
        ttft_ms=args.ttft_ms,
        tokens_per_s=args.tokens_per_s,
        fail_mode=args.fail_mode,
        after_tokens=args.after_tokens,
        error_kind=args.error_kind,
        drip_ms=args.drip_ms,
        kind=args.kind,
        unserved=tuple(m.strip() for m in args.unserved.split(",") if m.strip()),
        sse_line_end=args.sse_line_end,
        sse_fields=args.sse_fields,
    )
    uvloop.run(serve_sim(options, args.host, args.port))
    return 0


def _demo(args: argparse.Namespace) -> int:
    """`router demo`: the embedded default, until Ctrl-C."""
    from router.demo import run_demo

    return run_demo(args.port)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `router` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
