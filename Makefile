# Developer entry points. `make demo` and `make test` are the two commands in README.md.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PYTEST_ARGS ?=

.PHONY: setup system-deps vocab build build-runtime wheel real-servers lint test test-rust test-python bench bench-scenarios demo clean

system-deps:
	@if ! command -v redis-server >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1 \
		|| ! test -x /usr/sbin/nginx || ! command -v openssl >/dev/null 2>&1 || ! command -v cmake >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server chromium nginx openssl cmake >/dev/null; \
	fi

# tiktoken's cl100k/o200k vocabularies, offline: the tiktoken-rs crate ships them, and the tests
# and benches compare token counts with tiktoken loaded from there (tests/reference.py).
vocab:
	@if ! ls $$HOME/.cargo/registry/src/*/tiktoken-rs-*/assets/o200k_base.tiktoken >/dev/null 2>&1; then \
		d=$$(mktemp -d) && mkdir "$$d/src" && touch "$$d/src/lib.rs" && \
		printf '[package]\nname = "vocab"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\ntiktoken-rs = "0.7"\n' > "$$d/Cargo.toml" && \
		cargo fetch -q --manifest-path "$$d/Cargo.toml" && rm -rf "$$d"; \
	fi

build:
	$(PIP) install -q -e '.[dev]'

# Only what `router` itself needs (the demo): the package and its runtime dependencies.
build-runtime:
	$(PIP) install -q -e .

setup: system-deps vocab build

# The release wheel in dist/ (abi3: one file for CPython >= 3.11), what ops install
# (docs/PRODUCTION.md). Same cargo target dir and flags as `build`, so after it this only packs.
wheel:
	@$(PYTHON) -m maturin --version >/dev/null 2>&1 || $(PIP) install -q 'maturin>=1.7,<2'
	$(PYTHON) -m maturin build --release --out dist

# llama.cpp's llama-server and the llama-cpp-python server for tests/real, built once from the
# llama-cpp-python sdist and cached in $${ROUTER_REAL_CACHE:-~/.cache/router-real} (tests/real/build.py).
real-servers:
	$(PYTHON) -m tests.real.build

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	$(PYTHON) -m ruff check python tests bench fuzz
	$(PYTHON) -m ruff format --check python tests bench fuzz
	$(PYTHON) -m mypy
	$(PYTHON) -m mypy.stubtest router._native
	$(PYTHON) -m tests.lint_imports

test-rust:
	cargo test --quiet

test-python:
	$(PYTHON) -m pytest $(PYTEST_ARGS)

test: setup lint test-rust real-servers test-python

bench: build
	$(PYTHON) -m pytest bench/micro --benchmark-only --benchmark-columns=min,median,mean,ops

# The load-generator scenarios (bench/README.md); each under a minute, results in results/.
bench-scenarios:
	$(PYTHON) -m bench.scenarios.global_users --results results/global_users
	$(PYTHON) -m bench.scenarios.agent_loop --results results/agent_loop
	$(PYTHON) -m bench.scenarios.overhead_nginx --results results/overhead_nginx

# `make demo` on a fresh machine: its own virtual environment (never the global interpreter),
# the router with the openai SDK the printed example uses, then the demo itself.
DEMO_VENV ?= .venv-demo
demo:
	@echo "==> [1/3] virtual environment $(DEMO_VENV)"
	@test -x $(DEMO_VENV)/bin/python || $(PYTHON) -m venv $(DEMO_VENV)
	@echo "==> [2/3] installing router and the openai SDK into it; the first time this compiles"
	@echo "          the Rust extension (cargo, release mode): a few minutes on a small machine"
	@$(DEMO_VENV)/bin/python -m pip install --disable-pip-version-check -e . openai
	@echo "==> [3/3] starting three simulated regions and the router (Ctrl-C stops them)"
	@$(DEMO_VENV)/bin/router demo

clean:
	rm -rf target dist python/router/*.so
