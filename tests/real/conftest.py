"""Fixtures for the real-server tier: llama.cpp's llama-server and llama-cpp-python's server.

They need `make real-servers` (python -m tests.real.build) first. Without it the fixtures fail
(not skip) with that hint: CI builds them as part of `make test`.

Servers are session-scoped (each one loads the model once); a test that changes a server's
state (interrupting a stream) starts its own with `start_real`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.real.artifacts import require
from tests.real.model import ModelFiles, ensure_model
from tests.real.servers import start_llama_cpp_python, start_llama_server
from tests.support import Proc


@pytest.fixture(scope="session")
def real_model() -> ModelFiles:
    """The cached tiny GGUF and its tokenizer.json (written on first use); servers must be built."""
    require()
    return ensure_model()


@pytest.fixture(scope="session")
def llama_server(
    real_model: ModelFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proc]:
    proc = start_llama_server(tmp_path_factory.mktemp("llama-server"), real_model.gguf)
    yield proc
    proc.kill()


@pytest.fixture(scope="session")
def llama_server_embed(
    real_model: ModelFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proc]:
    proc = start_llama_server(
        tmp_path_factory.mktemp("llama-server-embed"), real_model.gguf, embeddings=True
    )
    yield proc
    proc.kill()


@pytest.fixture(scope="session")
def llama_cpp_server(
    real_model: ModelFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proc]:
    proc = start_llama_cpp_python(tmp_path_factory.mktemp("llama-cpp-python"), real_model.gguf)
    yield proc
    proc.kill()


@pytest.fixture(scope="session")
def llama_cpp_server_embed(
    real_model: ModelFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proc]:
    proc = start_llama_cpp_python(
        tmp_path_factory.mktemp("llama-cpp-python-embed"), real_model.gguf, embedding=True
    )
    yield proc
    proc.kill()


RealFactory = Callable[..., Proc]


@pytest.fixture
def start_real(real_model: ModelFiles, tmp_path: Path) -> Iterator[RealFactory]:
    """Factory: start_real("llama-server" | "llama-cpp-python", **options) -> a fresh server."""
    procs: list[Proc] = []

    def start(kind: str, **options: object) -> Proc:
        if kind == "llama-server":
            proc = start_llama_server(tmp_path, real_model.gguf, **options)  # type: ignore[arg-type]
        else:
            proc = start_llama_cpp_python(tmp_path, real_model.gguf, **options)  # type: ignore[arg-type]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
