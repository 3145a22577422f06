"""Build the two real inference servers once and cache them outside the checkout.

    python -m tests.real.build       # or `make real-servers`; idempotent, reuses the cache

From the llama-cpp-python sdist on PyPI (it vendors llama.cpp), under
${ROUTER_REAL_CACHE:-$HOME/.cache/router-real}/<version>/:

  bin/llama-server + its shared libraries   llama.cpp's own server, CPU only, one CMake build
  wheels/llama_cpp_python-*.whl             the Python bindings, with the same shared libraries
  venv/                                     a venv with that wheel and its [server] extras

llama.cpp is compiled once: the CMake tree that builds llama-server also yields libllama,
libggml* and libmtmd, which are exactly the libraries the wheel ships, so the wheel is built
with LLAMA_BUILD=OFF (no compiler run) around those libraries instead of compiling them again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import venv
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.real.artifacts import LLAMA_CPP_PYTHON, llama_server_bin, venv_python, version_dir
from tests.real.model import ensure_model

SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    # libraries and llama-server land together in bin/ and find each other there
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",  # the server lives under tools/; only its target is built
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # would download the web UI from the Hugging Face hub
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_METAL=OFF",
)
TARGETS = ("llama-server", "llama", "mtmd")


def log(message: str) -> None:
    print(f"[real-servers] {message}", flush=True)


def run(args: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    log("$ " + " ".join(args))
    subprocess.run(list(args), check=True, env={**os.environ, **(env or {})}, cwd=cwd)


@contextmanager
def timed(label: str, times: dict[str, float]) -> Iterator[None]:
    """Time a step, print it and keep it for the summary."""
    start = time.monotonic()
    yield
    times[label] = time.monotonic() - start
    log(f"{label}: {times[label]:.0f}s")


def sdist_source(root: Path, times: dict[str, float]) -> Path:
    """The unpacked sdist, downloaded from PyPI first if needed."""
    source = root / "src" / SDIST
    if (source / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        log(f"source cached: {source}")
        return source
    archive = root / f"{SDIST}.tar.gz"
    if not archive.exists():
        with timed("download sdist", times):
            run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-binary",
                    ":all:",
                    "--no-deps",
                    "--dest",
                    str(root),
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                ]
            )
    partial = root / "src.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(partial, filter="tar")
    (root / "src").mkdir(exist_ok=True)
    (partial / SDIST).rename(source)
    partial.rmdir()
    return source


def build_llama_cpp(root: Path, source: Path, times: dict[str, float]) -> Path:
    """llama-server and the shared libraries, copied to <root>/bin; returns that directory."""
    bin_dir = root / "bin"
    if llama_server_bin().exists():
        log(f"llama-server cached: {llama_server_bin()}")
        return bin_dir
    tree = root / "build" / "llama.cpp"
    with timed("cmake configure", times):
        run(["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(tree), *CMAKE_OPTIONS])
    with timed("cmake build (llama-server, llama, mtmd)", times):
        jobs = str(os.cpu_count() or 2)
        run(["cmake", "--build", str(tree), "--target", *TARGETS, "-j", jobs])
    partial = root / "bin.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for path in (tree / "bin").iterdir():
        if path.name == "llama-server" or ".so" in path.name:
            shutil.copy2(path, partial / path.name, follow_symlinks=False)
    shutil.rmtree(bin_dir, ignore_errors=True)
    partial.rename(bin_dir)
    return bin_dir


def build_wheel(root: Path, source: Path, bin_dir: Path, times: dict[str, float]) -> Path:
    """The llama-cpp-python wheel around the already built libraries (LLAMA_BUILD=OFF)."""
    wheels = root / "wheels"
    found = sorted(wheels.glob("llama_cpp_python-*.whl")) if wheels.exists() else []
    if found:
        log(f"wheel cached: {found[0]}")
        return found[0]
    # A copy without the vendored sources (not needed with LLAMA_BUILD=OFF) and without the
    # .gitignore, which scikit-build-core honours and which ignores llama_cpp/lib/*.so.
    tree = root / "build" / "wheel-src"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(source, tree, ignore=shutil.ignore_patterns("vendor", ".git", ".gitignore"))
    lib = tree / "llama_cpp" / "lib"
    lib.mkdir()
    for path in bin_dir.iterdir():
        if ".so" in path.name:
            shutil.copy2(path, lib / path.name)  # symlinks resolved: a wheel holds plain files
    with timed("wheel", times):
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--wheel-dir",
                str(wheels),
                str(tree),
            ],
            env={"CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"},
        )
    (wheel,) = wheels.glob("llama_cpp_python-*.whl")
    return wheel


def install_venv(root: Path, wheel: Path, times: dict[str, float]) -> None:
    """A venv of its own for `python -m llama_cpp.server`, so the test interpreter stays clean."""
    python = venv_python()
    done = root / "venv" / ".installed"
    if done.exists() and done.read_text() == wheel.name:
        log(f"venv cached: {root / 'venv'}")
        return
    with timed("venv + pip install wheel[server]", times):
        shutil.rmtree(root / "venv", ignore_errors=True)
        venv.EnvBuilder(with_pip=True).create(root / "venv")
        run([str(python), "-m", "pip", "install", "-q", f"{wheel}[server]"])
        run(
            [
                str(python),
                "-c",
                "import llama_cpp, llama_cpp.server.app; print(llama_cpp.__version__)",
            ]
        )
    done.write_text(wheel.name)


def main() -> None:
    start = time.monotonic()
    times: dict[str, float] = {}
    root = version_dir()
    root.mkdir(parents=True, exist_ok=True)
    log(f"cache {root}")
    source = sdist_source(root, times)
    bin_dir = build_llama_cpp(root, source, times)
    wheel = build_wheel(root, source, bin_dir, times)
    install_venv(root, wheel, times)
    with timed("model", times):
        files = ensure_model()
    log(f"llama-server {llama_server_bin()}")
    log(f"llama_cpp.server {venv_python()} -m llama_cpp.server")
    log(f"model {files.gguf}")
    log(f"total {time.monotonic() - start:.0f}s")


if __name__ == "__main__":
    main()
