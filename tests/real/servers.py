"""Start the real inference servers as subprocesses on free 127.0.0.1 ports.

    proc = start_llama_server(tmp, model)                 # llama.cpp's llama-server, chat
    proc = start_llama_server(tmp, model, embeddings=True)
    proc = start_llama_cpp_python(tmp, model)            # python -m llama_cpp.server
    OpenAI(base_url=proc.url + "/v1", api_key="x")

Both listen before they can answer (llama-server loads the model after binding), so readiness
is an HTTP 200 from a cheap route, not an open port.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.real.artifacts import llama_server_bin, require, venv_python
from tests.support import Proc, free_port, spawn

MODEL_ALIAS = "real-tiny"
# Room for a 400-token answer after a short prompt; a 1200-token prompt overflows it.
CTX = 1024
THREADS = 2
READY_TIMEOUT = 90.0


def wait_http(proc: Proc, path: str, timeout: float = READY_TIMEOUT) -> None:
    """Poll GET path until it answers 200 (the process must stay alive meanwhile)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(
                f"{proc.args[0]} exited with {proc.popen.returncode}:\n{proc.output()}"
            )
        try:
            with urllib.request.urlopen(proc.url + path, timeout=2) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as err:
            last = f"{err.code} {err.read()[:200]!r}"
        except OSError as err:
            last = str(err)
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError(f"{path} not ready after {timeout}s ({last}):\n{proc.output()}")


def llama_server_args(model: Path, port: int, *, embeddings: bool = False) -> list[str]:
    args = [
        str(llama_server_bin()),
        "--model", str(model),
        "--alias", MODEL_ALIAS,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(CTX),
        "--parallel", "1",
        "--threads", str(THREADS),
        "--no-webui",
        "--jinja",
        "--metrics",
    ]  # fmt: skip
    if embeddings:
        # Mean pooling: a decoder-only llama has no pooling of its own; /v1/embeddings needs one.
        args += ["--embeddings", "--pooling", "mean"]
    return args


def start_llama_server(directory: Path, model: Path, *, embeddings: bool = False) -> Proc:
    """llama.cpp's llama-server, ready when GET /health answers 200 (503 while loading)."""
    require()
    port = free_port()
    kind = "embed" if embeddings else "chat"
    proc = spawn(
        llama_server_args(model, port, embeddings=embeddings),
        port,
        directory / f"llama-server-{kind}-{port}.log",
        ready_timeout=READY_TIMEOUT,
    )
    wait_http(proc, "/health")
    return proc


def llama_cpp_python_args(
    model: Path, port: int, *, embedding: bool = False, extra: Sequence[str] = ()
) -> list[str]:
    return [
        str(venv_python()),
        "-m", "llama_cpp.server",
        "--model", str(model),
        "--model_alias", MODEL_ALIAS,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(CTX),
        "--n_threads", str(THREADS),
        "--n_threads_batch", str(THREADS),
        "--embedding", json.dumps(embedding),
        # mean pooling, as llama-server's --pooling mean (without it: one vector per token)
        *(["--kv_overrides", "llama.pooling_type=int:1"] if embedding else []),
        *extra,
    ]  # fmt: skip


def start_llama_cpp_python(
    directory: Path, model: Path, *, embedding: bool = False, extra: Sequence[str] = ()
) -> Proc:
    """`python -m llama_cpp.server` from its own venv, ready when GET /v1/models answers 200."""
    require()
    port = free_port()
    proc = spawn(
        llama_cpp_python_args(model, port, embedding=embedding, extra=extra),
        port,
        directory / f"llama-cpp-python-{port}.log",
        # its own venv: none of the test interpreter's packages leak in
        env={"PYTHONPATH": "", "PYTHONNOUSERSITE": "1"},
        ready_timeout=READY_TIMEOUT,
    )
    wait_http(proc, "/v1/models")
    return proc
