"""Shared helpers for tests: free ports, subprocesses polled until ready, a real redis-server."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    except BaseException as exc:
        # Ctrl-C or SIGTERM while waiting too: nobody else knows this process yet.
        proc.kill()
        if not isinstance(exc, Exception):
            raise
        raise RuntimeError(f"{args} failed to start:\n{proc.output()}") from None
    return proc


def router_cmd(*args: str) -> list[str]:
    """The `router` command, run with this interpreter."""
    return [sys.executable, "-m", "router", *args]


def stream_text(url: str, body: dict[str, Any], timeout: float = 20) -> str:
    """POST `body` as a streamed request (`stream: true` added) to `url`; the 200 answer's
    text, read to its end."""
    request = urllib.request.Request(
        url,
        data=json.dumps({"stream": True, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        assert resp.status == 200
        text: str = resp.read().decode()
    return text


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


def start_redis(
    tmp: Path,
    port: int | None = None,
    *,
    extra: Sequence[str] = (),
    tls: TlsFiles | None = None,
    password: str | None = None,
) -> Proc:
    """A real redis-server on 127.0.0.1, no persistence; with `tls`, TLS only on `port`."""
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("redis-server is not installed (make system-deps installs it)")
    port = port or free_port()
    listen = ["--port", str(port)]
    if tls is not None:
        listen = ["--port", "0", "--tls-port", str(port), *tls.server_args()]
    args = [
        binary,
        *listen,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(tmp),
        *(["--requirepass", password, "--masterauth", password] if password else []),
        *extra,
    ]
    return spawn(args, port, tmp / f"redis-{port}.log")


def redis_clients(port: int) -> tuple[int, int]:
    """The redis-server at `port`'s client connections open now (not a replica's link, not this
    query's own) and the connections it has accepted since it started (this query's included)."""
    done = subprocess.run(
        ["redis-cli", "-p", str(port)],
        input="CLIENT LIST\nINFO stats\n",
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    lines = done.stdout.splitlines()
    clients = [line for line in lines if line.startswith("id=")]
    mine = [line for line in clients if " cmd=client|list " in line]
    links = [line for line in clients if " flags=S " in line or " flags=M " in line]
    received = next(line for line in lines if line.startswith("total_connections_received:"))
    return len(clients) - len(mine) - len(links), int(received.partition(":")[2])


@dataclass(frozen=True)
class TlsFiles:
    """A self-signed certificate for 127.0.0.1 made with openssl at test time."""

    cert: Path
    key: Path

    def server_args(self) -> list[str]:
        return [
            "--tls-cert-file",
            str(self.cert),
            "--tls-key-file",
            str(self.key),
            "--tls-ca-cert-file",
            str(self.cert),
            "--tls-auth-clients",
            "no",
        ]


def self_signed(tmp: Path) -> TlsFiles:
    """Generate a throwaway certificate (and key) valid for 127.0.0.1."""
    files = TlsFiles(cert=tmp / "tls-cert.pem", key=tmp / "tls-key.pem")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(files.key),
            "-out",
            str(files.cert),
        ],
        check=True,
        capture_output=True,
    )
    return files


@dataclass
class RedisClusterProcs:
    """A local Redis Cluster: masters and their replicas as real redis-server processes."""

    nodes: list[Proc]
    password: str | None = None

    @property
    def url(self) -> str:
        """A URL naming one node; the client learns the rest."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.nodes[0].port}/0"

    def cli(self, port: int, *args: str) -> str:
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        done = subprocess.run(
            ["redis-cli", "-p", str(port), *auth, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return done.stdout

    def master_of(self, key: str) -> Proc:
        """The node serving `key`'s slot now."""
        alive = next(n for n in self.nodes if n.popen.poll() is None)
        slot = int(self.cli(alive.port, "CLUSTER", "KEYSLOT", key).strip())
        for line in self.cli(alive.port, "CLUSTER", "NODES").splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2]:
                continue
            for span in parts[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    port = int(parts[1].split(":")[1].split("@")[0])
                    return next(n for n in self.nodes if n.port == port)
        raise LookupError(f"no live master serves slot {slot}")

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Poll until every live node reports cluster_state:ok and every replica is in sync."""
        deadline = time.monotonic() + timeout
        while True:
            live = [n for n in self.nodes if n.popen.poll() is None]
            ok = all("cluster_state:ok" in self.cli(n.port, "CLUSTER", "INFO") for n in live)
            # A replica takes over only once it has synced from its master.
            roles = [self.cli(n.port, "INFO", "replication") for n in live]
            synced = all("role:master" in r or "master_link_status:up" in r for r in roles)
            if ok and synced:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("redis cluster never reached cluster_state:ok")
            time.sleep(0.1)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (so at most 55535)."""
    while True:
        port = random.randint(20000, 45000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port


def start_redis_cluster(
    tmp: Path, masters: int = 3, replicas: int = 1, password: str | None = None
) -> RedisClusterProcs:
    """`masters` x (1 + `replicas`) cluster-enabled redis-servers joined with
    `redis-cli --cluster create`; a killed master's replica takes over after ~1 s."""
    nodes: list[Proc] = []
    cluster = RedisClusterProcs(nodes, password)
    try:
        for _ in range(masters * (1 + replicas)):
            port = cluster_port()
            home = tmp / f"cluster-{port}"
            home.mkdir()
            extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(home / "nodes.conf"),
                "--cluster-node-timeout",
                "1000",
                "--cluster-replica-validity-factor",
                "0",
            ]
            nodes.append(start_redis(home, port, extra=extra, password=password))
        auth = ["-a", password, "--no-auth-warning"] if password else []
        addresses = [f"127.0.0.1:{n.port}" for n in nodes]
        options = ["--cluster-replicas", str(replicas), "--cluster-yes"]
        subprocess.run(
            ["redis-cli", *auth, "--cluster", "create", *addresses, *options],
            check=True,
            capture_output=True,
            timeout=60,
        )
        cluster.wait_ok()
    except Exception:
        cluster.kill()
        raise
    return cluster
