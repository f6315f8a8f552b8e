# Two entry points on a fresh machine: `make demo` and `make test`.
# Each creates .venv when missing and installs what it needs.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
# On a machine without an NVIDIA driver, install the CPU build of torch first so that
# nothing later resolves a multi-GB CUDA wheel. With a GPU, the default build is wanted.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)

.PHONY: demo test test-fast lint install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.torch: $(BIN)/python
ifeq ($(HAS_GPU),yes)
	$(BIN)/pip install --quiet torch
else
	$(BIN)/pip install --quiet torch==$(TORCH_VERSION)
endif
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(BIN)/meshminer demo $(DEMO_ARGS)

# Two workers for the suite; then, alone, the tests that measure CPU or time (`solo`).
# MARK narrows both (make test MARK="not slow"); pytest exits 5 when nothing is selected.
MARK ?=
AND_MARK := $(if $(MARK), and ($(MARK)))
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=15 -m "not solo$(AND_MARK)" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m "solo$(AND_MARK)" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The inner loop: unit tests only, none that starts a subprocess, a node, a libp2p host
# or a browser (those are marked `process`, `slow` or `browser`; under --no-processes,
# tests/conftest.py fails a test that starts a process unmarked). MARK narrows it too.
FAST_MARK := not slow and not solo and not browser and not process
test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 2 --dist worksteal --no-processes -m "$(FAST_MARK)$(AND_MARK)" $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
