# Set-up and checks, each creating or reusing the virtual environment in .venv.
#   make lab    JupyterLab with tpunb and the bundled notebooks (CPU default)
#   make test   lint, then every test group (unit, kernel, notebooks)
# TORCH picks the torch build; the default is the CPU-friendly release tpunb is tested with.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tpunb-installed

.PHONY: lab test lint venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest
