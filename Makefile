# Everything runs inside .venv, which `make install` creates. A torch already in .venv (say a CUDA
# build you installed there) is kept; otherwise the CPU build torch==2.13.0 is installed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TRAIN_MINUTES ?= 3

.PHONY: install test test-all test-gpu demo bench clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

test-all: install
	$(BIN)/python -m pytest -q -m "not gpu"

test-gpu: install
	$(BIN)/python -m pytest -q -m gpu

demo: install
	PATH="$(abspath $(BIN)):$$PATH" TRAIN_MINUTES=$(TRAIN_MINUTES) bash recipes/multi30k_en_de/run.sh

bench: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) *.egg-info work
