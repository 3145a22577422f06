"""Processes the scenarios start on 127.0.0.1: sim regions, routers, nginx; all killed at exit."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Literal

from tests.support import Proc, free_port, router_cmd, spawn, start_redis

CacheLevel = Literal["exact", "normalized"]
NGINX = "/usr/sbin/nginx"


class Procs:
    """Starts processes into one folder and kills every one of them on close."""

    def __init__(self, folder: Path) -> None:
        # Absolute: nginx resolves a relative -c against its -p prefix.
        self.folder = folder.resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._procs: list[Proc] = []
        # How each one is stopped: sims and routers hold nothing worth a graceful drain (which
        # takes seconds each on a loaded machine); nginx needs SIGTERM so its master reaps the
        # worker instead of orphaning it.
        self._stop: dict[int, int] = {}

    def _spawn(self, args: Sequence[str], name: str, port: int, stop: int = signal.SIGKILL) -> Proc:
        # Generous: nine interpreters starting at once on two busy cores can take a while.
        proc = spawn(args, port, self.folder / f"{name}.log", ready_timeout=60.0)
        self._procs.append(proc)
        self._stop[proc.popen.pid] = stop
        return proc

    def sim_region(
        self,
        name: str,
        *,
        rtt_ms: float,
        ttft_ms: float,
        tokens_per_s: float,
        model: str = "sim-1",
        extra: Sequence[str] = (),
        port: int | None = None,
    ) -> Proc:
        """A simulated OpenAI-compatible region with an in-process round-trip delay."""
        port = port or free_port()
        flags = {
            "--port": port,
            "--name": name,
            "--rtt-ms": f"{rtt_ms:g}",
            "--ttft-ms": f"{ttft_ms:g}",
            "--tokens-per-s": f"{tokens_per_s:g}",
            "--models": model,
        }
        args = router_cmd("sim-region", *(str(x) for kv in flags.items() for x in kv), *extra)
        return self._spawn(args, f"sim-{name}-{port}", port)

    def router(
        self,
        name: str,
        regions: Sequence[tuple[str, str, float]],
        *,
        cache: CacheLevel | None = None,
        cache_redis: str | None = None,
        model: str = "sim-1",
    ) -> Proc:
        """A router whose regions are (name, base URL, bias ms); auth off, cache as asked."""
        port = free_port()
        lines = [
            "[server]",
            f'listen = "127.0.0.1:{port}"',
            "[auth]",
            "enabled = false",
            "[observability]",
            "access_log = false",
            'log_level = "warning"',
            "[cache]",
            f"enabled = {'true' if cache else 'false'}",
        ]
        if cache:
            lines.append(f'level = "{cache}"')
        if cache and cache_redis:
            lines.append(f'redis_url = "{cache_redis}"')
        for region, url, bias_ms in regions:
            lines += [
                "[[regions]]",
                f'name = "{region}"',
                f'base_url = "{url}"',
                f'models = ["{model}"]',
                f"bias_ms = {bias_ms:g}",
            ]
        config = self.folder / f"router-{name}-{port}.toml"
        config.write_text("\n".join(lines) + "\n")
        return self._spawn(router_cmd("serve", "--config", str(config)), f"router-{name}", port)

    def redis(self) -> Proc:
        """A real redis-server on 127.0.0.1 without persistence (the shared cache tier)."""
        proc = start_redis(self.folder)
        self._procs.append(proc)
        self._stop[proc.popen.pid] = signal.SIGKILL
        return proc

    def nginx(self, upstream_port: int) -> Proc:
        """Debian's nginx as a plain streaming reverse proxy, foreground, config in a temp dir."""
        if shutil.which(NGINX) is None:
            raise RuntimeError(f"{NGINX} is not installed (apt-get install nginx)")
        port = free_port()
        args = nginx_cmd(self.folder / f"nginx-{port}", port, upstream_port)
        return self._spawn(args, f"nginx-{port}", port, stop=signal.SIGTERM)

    def close(self) -> None:
        """Signal every process started here at once, then reap them; SIGKILL stragglers."""
        for proc in self._procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(self._stop.get(proc.popen.pid, signal.SIGTERM))
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            try:
                proc.popen.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
        self._procs.clear()
        self._stop.clear()


@contextlib.contextmanager
def procs(folder: Path) -> Iterator[Procs]:
    """Procs for a `with` block."""
    p = Procs(folder)
    try:
        yield p
    finally:
        p.close()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C, so every `finally` (Procs.close) runs."""


def _stop(signum: int, frame: FrameType | None) -> None:
    # Once: a second signal must not cut the cleanup the first one started.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def interruptible(prog: str, run: Callable[[], int]) -> int:
    """run() where Ctrl-C and SIGTERM stop every process started and end in one line on
    stderr: exit 130 (SIGINT) or 143 (SIGTERM), as a shell reports a signal, no traceback."""
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run()
    except KeyboardInterrupt as exc:
        term = isinstance(exc, Terminated)
        print(f"{prog}: {'terminated' if term else 'interrupted'}", file=sys.stderr)
        return 128 + (signal.SIGTERM if term else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def nginx_cmd(prefix: Path, port: int, upstream_port: int) -> list[str]:
    """Create `prefix` with nginx's config for port -> upstream_port; the command that runs it."""
    prefix.mkdir()
    conf = prefix / "nginx.conf"
    conf.write_text(nginx_config(prefix, port, upstream_port))
    return [NGINX, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]


def nginx_config(prefix: Path, port: int, upstream_port: int) -> str:
    """One worker, keep-alive upstream pool, no buffering (SSE passes through as it comes)."""
    temp = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
    temps = "\n".join(f"    {t}_temp_path {prefix}/{t}_temp;" for t in temp)
    return f"""daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temps}
    upstream origin {{
        server 127.0.0.1:{upstream_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 120s;
        }}
    }}
}}
"""


def get_json(url: str, timeout_s: float = 5.0) -> object:
    """GET a JSON document from 127.0.0.1 (a sim region's counters, a router's status)."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"bench traffic stays on 127.0.0.1, not {url}")
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def sim_stats(proc: Proc) -> dict[str, int]:
    """A sim region's own counters (GET /sim/stats), the integer ones."""
    stats = get_json(proc.url + "/sim/stats")
    if not isinstance(stats, dict):
        raise TypeError(f"unexpected /sim/stats from {proc.url}: {stats!r}")
    return {k: v for k, v in stats.items() if isinstance(v, int)}
