# Everything runs inside .venv, which `make install` creates. A torch already in .venv (say a CUDA
# build you installed there) is kept; otherwise the CPU build torch==2.13.0 is installed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TRAIN_MINUTES ?= 5

.PHONY: install lint test test-cpus test-all test-gpu test-browser demo bench bench-peers clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test]" --config-settings editable_mode=compat
	touch $(STAMP)

# ruff (lint and format check) and mypy, with the settings in pyproject.toml.
lint: install
	$(BIN)/ruff check nmt_cli tests benchmarks
	$(BIN)/ruff format --check nmt_cli tests benchmarks
	$(BIN)/mypy

# The fast suite (slow and gpu tests excluded), after lint: a test file per worker on every core (pytest-xdist),
# each worker's PyTorch on one thread (more would only take the other workers' cores); then, alone, the tests
# that compare latencies (marked serial), which a test beside them would disturb. Its runs share TEST_BUILT, made
# afresh each time, where conftest.py's built_once keeps the models it trains (the tiny and the trained copy
# model) for all of them, test-cpus's reruns included; `python tests/conftest.py` trains them there beside lint,
# which leaves a core free (mypy), and a test that asks for one before it is done waits for it.
# The tests start a hundred interpreters and four pytest sessions: Python's bytecode caches (__pycache__, ignored
# by git) spare each one compiling nmt_cli and pytest rewriting the tests' asserts again, even where the
# environment turns them off (PYTHONDONTWRITEBYTECODE=1).
TEST_BUILT := $(CURDIR)/work/test-built
test test-cpus test-all: export PYTHONDONTWRITEBYTECODE :=

test: install
	rm -rf $(TEST_BUILT)
	NMT_TEST_BUILT=$(TEST_BUILT) OMP_NUM_THREADS=1 $(BIN)/python tests/conftest.py & built=$$!; \
	$(MAKE) --no-print-directory lint && NMT_TEST_BUILT=$(TEST_BUILT) OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q \
		-n auto --dist loadfile -m "not slow and not gpu and not serial"; status=$$?; wait $$built; exit $$status
	NMT_TEST_BUILT=$(TEST_BUILT) $(BIN)/python -m pytest -q -m "serial and not slow and not gpu"
	NMT_TEST_BUILT=$(TEST_BUILT) $(MAKE) --no-print-directory test-cpus
	rm -rf $(TEST_BUILT)

# The tests whose outcome can depend on the CPU's instruction sets, again as the CPUs users have that this one
# has more than: AVX2 only (where this one has AVX-512), AVX-512 without VNNI and BF16 (where it has them). Each
# library's variable caps the code it runs, and nmt's own choices read them (runtime.cpu_has, cpu_precision.sh):
#   tests/model                        every product: the matmul route and its dtypes, ATen's and oneDNN's kernels,
#                                      the int8 engine and its activation range, bf16 packing
#   tests/search/test_beam.py          translation's packed linears (float32, bf16) against the model's own
#   tests/train/test_precision.py, test_update_casts.py, test_loss_schedule.py: bf16 training through the route
#   tests/export/test_ctranslate2.py   CTranslate2's kernels by instruction set against nmt's translations
# serve opens its models by search's open_for_inference, covered there; the rest runs these products the same way.
CPU_TESTS := tests/model tests/search/test_beam.py tests/train/test_precision.py tests/train/test_update_casts.py \
	tests/train/test_loss_schedule.py tests/export/test_ctranslate2.py
AVX2_CPU := ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 \
	MKL_ENABLE_INSTRUCTIONS=AVX2 CT2_FORCE_CPU_ISA=AVX2
AVX512_CPU := ONEDNN_MAX_CPU_ISA=AVX512_CORE ATEN_CPU_CAPABILITY=avx512 FBGEMM_ENABLE_INSTRUCTIONS=AVX512 \
	MKL_ENABLE_INSTRUCTIONS=AVX512 CT2_FORCE_CPU_ISA=AVX512
# The two CPUs' runs go side by side, a process each on its own core (each one's xdist workers would spend what
# they save starting up): each writes to a file of its own, shown when both are done.
CPU_PYTEST := OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow and not gpu and not serial"

test-cpus: install
	out=$$(mktemp -d); status=0; \
	if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then $(AVX2_CPU) $(CPU_PYTEST) $(CPU_TESTS) >$$out/avx2 2>&1 & avx2=$$!; fi; \
	if grep -qw avx512_vnni /proc/cpuinfo 2>/dev/null; then $(AVX512_CPU) $(CPU_PYTEST) $(CPU_TESTS) >$$out/avx512 2>&1 & avx512=$$!; fi; \
	if [ -n "$$avx2" ]; then wait $$avx2 || status=1; echo "as an AVX2-only CPU:"; cat $$out/avx2; fi; \
	if [ -n "$$avx512" ]; then wait $$avx512 || status=1; echo "as an AVX-512 CPU without VNNI and BF16:"; cat $$out/avx512; fi; \
	rm -rf $$out; exit $$status

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

# The Multi30k recipe with settings that learn fastest in a few minutes on 2 cores (recipes/multi30k_en_de/README.md:
# 2+2 layers and a 4,000-piece vocabulary, small batches, a short warm-up, one validation at the end, no averaging),
# in its own work directory; `bash recipes/multi30k_en_de/run.sh` is the full recipe with the paper-like settings.
DEMO_SETTINGS := WORK_DIR=work/demo LAYERS=2 VOCAB=4000 MAX_TOKENS=2048 WARMUP=150 LR_SCALE=0.5 DROPOUT=0.1 N_AVERAGE=1

demo: install
	PATH="$(abspath $(BIN)):$$PATH" $(DEMO_SETTINGS) SAVE_MINUTES=$(TRAIN_MINUTES) TRAIN_MINUTES=$(TRAIN_MINUTES) \
		bash recipes/multi30k_en_de/run.sh

bench: install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/run_all.py

# nmt next to fairseq and CTranslate2 in one run on this machine (../shared/peer-bench; about 30 minutes;
# ROUNDS=2 runs every toolkit twice, alternating, where the machine drifts).
bench-peers: install
	bash benchmarks/peers.sh

clean:
	rm -rf $(VENV) *.egg-info work
