# Everything runs inside .venv, which `make install` creates. A torch already in .venv (say a CUDA
# build you installed there) is kept; otherwise the CPU build torch==2.13.0 is installed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TRAIN_MINUTES ?= 5

.PHONY: install lint test test-all test-gpu test-browser demo bench bench-peers clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

# ruff (lint and format check) and mypy, with the settings in pyproject.toml.
lint: install
	$(BIN)/ruff check nmt_cli tests benchmarks
	$(BIN)/ruff format --check nmt_cli tests benchmarks
	$(BIN)/mypy

# The fast suite (slow and gpu tests excluded), after lint: a test file per worker on every core (pytest-xdist),
# each worker's PyTorch on one thread (more would only take the other workers' cores); then, alone, the tests
# that compare latencies (marked serial), which a test beside them would disturb.
test: lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow and not gpu and not serial"
	$(BIN)/python -m pytest -q -m "serial and not slow and not gpu"

# Adds the slow tests: torchrun ranks, SIGKILL torture, recipe-scale runs.
test-all: lint
	$(BIN)/python -m pytest -q -m "not gpu"

# The CUDA tests; they skip themselves where no GPU is visible.
test-gpu: install
	$(BIN)/python -m pytest -q -m gpu

# The page of `nmt serve` driven in headless Chromium (Debian's chromium and chromium-driver, installed here if
# missing); the fast suite runs it too where both are installed.
test-browser: install
	command -v chromedriver >/dev/null || (apt-get update -q && apt-get install -y -q chromium chromium-driver)
	$(BIN)/python -m pytest -q -m browser tests/serve

demo: install
	PATH="$(abspath $(BIN)):$$PATH" TRAIN_MINUTES=$(TRAIN_MINUTES) WARMUP=$${WARMUP:-200} bash recipes/multi30k_en_de/run.sh

bench: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/run_all.py

# nmt next to fairseq and CTranslate2 in one run on this machine (../shared/peer-bench; about 30 minutes;
# ROUNDS=2 runs every toolkit twice, alternating, where the machine drifts).
bench-peers: install
	bash benchmarks/peers.sh

clean:
	rm -rf $(VENV) *.egg-info work
