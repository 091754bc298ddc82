# Set-up and checks, each creating or reusing the virtual environment in .venv.
#   make lab    JupyterLab with tpunb and the bundled notebooks (CPU default)
#   make test   lint, then every test group (unit, kernel, browser, notebooks)
# TORCH picks the torch build; the default is the CPU-friendly release tpunb is tested with.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tpunb-installed

.PHONY: lab test lint venv chromium

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Browser tests drive Debian's chromium (never a downloaded browser); as root, install it.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium is not installed and this is not root: browser tests will be skipped"

test: lint chromium
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest
