"""Shared helpers for tests: free ports, subprocesses polled until ready, a real redis-server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_port(
    port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll until something accepts connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def is_access_line(line: str) -> bool:
    """A JSON access-log line (operational log lines in JSON carry `logger`, not `request_id`)."""
    return line.startswith("{") and '"request_id":' in line and '"logger":' not in line


@dataclass
class Proc:
    """A child process started by a test, with its port and captured output file."""

    args: Sequence[str]
    port: int
    log: Path
    popen: subprocess.Popen[bytes] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send a signal (SIGKILL by default) and reap the process."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = 10.0) -> str:
        """The output once it contains `text` (access lines are written in batches)."""
        deadline = time.monotonic() + timeout
        while text not in (out := self.output()):
            assert time.monotonic() < deadline, f"{text!r} not in output:\n{out}"
            time.sleep(0.05)
        return out

    def access_lines(self, count: int, timeout: float = 10.0) -> list[dict[str, object]]:
        """The first `count` JSON access-log lines, polling: the router writes them in batches."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [ln for ln in self.output().splitlines() if is_access_line(ln)]
            if len(lines) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(lines) >= count, f"{len(lines)} access lines, wanted {count}:\n{self.output()}"
        return [json.loads(ln) for ln in lines[:count]]


def spawn(
    args: Sequence[str],
    port: int,
    log: Path,
    env: dict[str, str] | None = None,
    ready_timeout: float = 20.0,
    cwd: Path | None = None,
) -> Proc:
    """Start a process (in the repository, or `cwd`), wait until it listens on `port`."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    fh = log.open("wb")
    with fh:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(
            list(args), stdout=fh, stderr=subprocess.STDOUT, env=full_env, cwd=cwd or REPO
        )
    proc = Proc(args=args, port=port, log=log, popen=popen)
    try:
        wait_for_port(port, ready_timeout, popen)
    except Exception:
        proc.kill()
        raise RuntimeError(f"{args} failed to start:\n{proc.output()}") from None
    return proc


def router_cmd(*args: str) -> list[str]:
    """The `router` command, run with this interpreter."""
    return [sys.executable, "-m", "router", *args]


def run_bench(module: str, *args: str, timeout: float = 120) -> str:
    """Run `python -m bench.MODULE ARGS` from the repository root; its stdout, or fail with its
    stderr when it exits non-zero."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def start_redis(tmp: Path, port: int | None = None) -> Proc:
    """A real redis-server on 127.0.0.1, no persistence."""
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("redis-server is not installed (make system-deps installs it)")
    port = port or free_port()
    args = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(tmp),
    ]
    return spawn(args, port, tmp / f"redis-{port}.log")
