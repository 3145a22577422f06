"""The release wheel, as ops get it: built with `maturin build --release`, installed into a fresh
virtual environment (no system site-packages, no PYTHONPATH), run from outside the checkout.

The build uses cargo's own target directory (CARGO_TARGET_DIR, else target/ in the checkout),
the one `make setup`'s editable install has just compiled the extension into with the same
profile and features: cargo finds it fresh and maturin only packs the wheel. Without that build
the first run compiles the extension (about 5 minutes on 2 cores), later ones reuse it.

The router's dependencies are installed from a wheelhouse kept outside the checkout in
${ROUTER_WHEEL_CACHE:-$HOME/.cache/router-wheel}/wheelhouse, offline once it holds them; it is
filled from the package index when a dependency is missing.
"""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import urllib.request
import venv
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO, Proc, free_port, spawn

# A cold build (every crate, fat LTO, one codegen unit) took 5 minutes on this 2-core machine
# under load: four times that before giving up. Everything after it takes seconds.
BUILD_TIMEOUT_S = 1200
STEP_TIMEOUT_S = 300
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 3 * STEP_TIMEOUT_S)

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["version"]


@dataclass(frozen=True)
class Installed:
    """The built wheel and the virtual environment it is installed in."""

    wheel: Path
    venv: Path
    outside: Path  # a working directory outside the checkout

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def cache_root() -> Path:
    """${ROUTER_WHEEL_CACHE:-$HOME/.cache/router-wheel}."""
    env = os.environ.get("ROUTER_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "router-wheel"


def clean_env() -> dict[str, str]:
    """This environment without what would let the checkout's sources in."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    }
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def run(args: Sequence[str], timeout: float, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command; its stdout, or fail with the end of its output."""
    done = subprocess.run(
        list(args),
        cwd=cwd,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


def maturin() -> str | None:
    """The maturin binary beside this interpreter (`make setup` installs it there, the [dev]
    extra), else one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "maturin"
    return str(beside) if beside.is_file() else shutil.which("maturin")


def build_wheel(out: Path) -> Path:
    """`maturin build --release` into `out`; the wheel."""
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not installed: the wheel cannot be built (rustup installs it)")
    tool = maturin()
    if tool is None:
        pytest.skip("maturin is not installed: `make setup` installs it (the [dev] extra)")
    env = clean_env()
    env.setdefault("CARGO_TARGET_DIR", str(REPO / "target"))
    args = [tool, "build", "--release", "--out", str(out), "--interpreter", sys.executable]
    run(args, BUILD_TIMEOUT_S, REPO, env)
    (wheel,) = out.glob("router-*.whl")
    return wheel


def install(wheel: Path, root: Path) -> Path:
    """A fresh venv at `root` with the wheel and its dependencies; offline when the wheelhouse
    already holds them."""
    venv.EnvBuilder(with_pip=True).create(root)
    python = str(root / "bin" / "python")
    house = cache_root() / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    offline = [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(house)]
    done = subprocess.run(
        [*offline, str(wheel)],
        cwd=root,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        # A dependency not in the wheelhouse yet (the first run, or a new requirement).
        run([python, "-m", "pip", "download", "-q", "--dest", str(house), str(wheel)],
            STEP_TIMEOUT_S, root)  # fmt: skip
        for stale in house.glob("router-*.whl"):
            stale.unlink()  # pip download keeps a copy of the wheel it was given
        run([*offline, str(wheel)], STEP_TIMEOUT_S, root)
    return root


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    wheel = build_wheel(tmp_path_factory.mktemp("dist"))
    root = install(wheel, tmp_path_factory.mktemp("wheelvenv") / "venv")
    return Installed(wheel=wheel, venv=root, outside=tmp_path_factory.mktemp("ops"))


def test_the_wheel_holds_the_package_and_right_metadata_only(installed: Installed) -> None:
    assert installed.wheel.name.startswith(f"router-{VERSION}-cp311-abi3-")
    with zipfile.ZipFile(installed.wheel) as whl:
        names = set(whl.namelist())
        info = f"router-{VERSION}.dist-info"
        metadata = email.parser.Parser().parsestr(whl.read(f"{info}/METADATA").decode())
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
        contents = {n: whl.read(n) for n in names}
    for needed in (
        "router/__init__.py",
        "router/_native.abi3.so",
        "router/_native.pyi",
        "router/py.typed",
        "router/static/status.html",  # the status page, read with importlib.resources
        f"{info}/licenses/LICENSE",
    ):
        assert needed in names, needed
    tops = {n.split("/")[0] for n in names}
    assert tops == {"router", info}  # no tests, bench, fuzz, docs or build files
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".env", ".pem"))]
    # The SBOM maturin writes names the crate by its build path; nothing else may.
    leaks = [n for n, data in contents.items() if str(REPO).encode() in data and "/sboms/" not in n]
    assert leaks == []
    assert metadata["Name"] == "router"
    assert metadata["Version"] == VERSION
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["License"] == "Apache-2.0"
    runtime = [r for r in metadata.get_all("Requires-Dist", []) if "extra ==" not in r]
    assert runtime == PYPROJECT["project"]["dependencies"]
    extras = set(metadata.get_all("Provides-Extra", []))
    assert extras == set(PYPROJECT["project"]["optional-dependencies"])
    assert {"otel", "plot"} <= extras
    assert "router=router.cli:main" in entry_points.replace(" ", "")


def test_the_installed_package_and_native_module_load_outside_the_checkout(
    installed: Installed,
) -> None:
    code = (
        "import json, router, router._native as n\n"
        "body = json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'Hi  there'}]})"
        ".encode()\n"
        "t = n.BucketTable(shards=2)\n"
        "t.set_limits('k', requests_per_minute=60, tokens_per_minute=100)\n"
        "print(json.dumps([router.__file__, n.__file__, router.__version__,\n"
        "    n.normalize('a  b'), n.fingerprint_hex(body, level='normalized'),\n"
        "    n.count_tokens('hello world', 'cl100k_base'), n.encoding_for_model('gpt-4o'),\n"
        "    n.count_request_tokens(body, 'o200k_base'), t.try_acquire('k', 10)[0],\n"
        "    n.ChatTemplate('{{ messages[0].content }}').render(body)]))\n"
    )
    out = json.loads(run([installed.bin("python"), "-c", code], 60, installed.outside))
    package, native, version, normalized, fingerprint, tokens, encoding, prompt, ok, rendered = out
    site = installed.venv / "lib"
    assert Path(package).is_relative_to(site), package
    assert Path(native).is_relative_to(site), native
    assert (version, normalized, tokens, encoding, ok, rendered) == (
        VERSION,
        "a b",
        2,
        "o200k_base",
        True,
        "Hi  there",
    )
    assert len(fingerprint) == 32
    assert prompt > 0
    assert run([installed.bin("router"), "--version"], 30, installed.outside) == (
        f"router {VERSION}\n"
    )


def _post(url: str, body: dict[str, object]) -> tuple[str, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read()


def test_the_installed_router_serves_a_sim_region(installed: Installed) -> None:
    env = {k: "" for k in ("PYTHONPATH", "PYTHONHOME")}  # spawn adds this environment's
    cwd = installed.outside
    sim_port, port = free_port(), free_port()
    procs: list[Proc] = []
    try:
        procs.append(
            spawn(
                [installed.bin("router"), "sim-region", "--port", str(sim_port), "--name", "eu"],
                sim_port,
                cwd / "sim.log",
                env=env,
                cwd=cwd,
            )
        )
        config = cwd / "router.toml"
        config.write_text(
            f'[server]\nlisten = "127.0.0.1:{port}"\n[auth]\nenabled = false\n'
            f'[[regions]]\nname = "eu"\nbase_url = "http://127.0.0.1:{sim_port}/v1"\n'
            'models = ["sim-1"]\nkind = "sim"\n'
        )
        procs.append(
            spawn(
                [installed.bin("router"), "serve", "--config", str(config)],
                port,
                cwd / "router.log",
                env=env,
                cwd=cwd,
            )
        )
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        ask = {"model": "sim-1", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}
        kind, whole = _post(url, ask)
        assert kind.startswith("application/json")
        choice = json.loads(whole)["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"]
        kind, stream = _post(url, {**ask, "stream": True})
        assert kind.startswith("text/event-stream")
        events = [ln[6:] for ln in stream.decode().splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        text = "".join(
            json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]
        )
        assert text == choice["message"]["content"]  # the sim answers the same prompt alike
        # The status page is a data file of the package.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as resp:
            assert b"<title>router status</title>" in resp.read()
    finally:
        for proc in procs:
            proc.kill()
    log = (cwd / "router.log").read_text()
    assert "Traceback" not in log, log


def test_bench_plot_asks_for_the_plot_extra_without_matplotlib(installed: Installed) -> None:
    results = str(installed.outside / "results")
    bench = ["bench", "--url", "http://127.0.0.1:1", "--count", "1", "--plot", "--results", results]
    done = subprocess.run(
        [installed.bin("router"), *bench],
        cwd=installed.outside,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (
        2,
        "router bench: --plot needs matplotlib: pip install 'router[plot]'\n",
    )
