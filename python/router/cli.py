"""The `router` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from router import __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per job."""
    parser = argparse.ArgumentParser(
        prog="router",
        description="Multi-region failover router for OpenAI-compatible LLM inference.",
    )
    parser.add_argument("--version", action="version", version=f"router {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    hash_key = commands.add_parser(
        "hash-key", help="print the SHA-256 hex of an API key, for [[auth.keys]] sha256"
    )
    hash_key.add_argument("key", nargs="?", help="the key (read from stdin when omitted)")
    hash_key.set_defaults(handler=_hash_key)
    _add_bench(commands)
    return parser


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
    from router.auth import hash_key

    key = (args.key if args.key is not None else sys.stdin.readline()).strip()
    if not key:
        print("router hash-key: no key given (argument or stdin)", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


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
