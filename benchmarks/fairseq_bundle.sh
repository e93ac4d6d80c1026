#!/usr/bin/env bash
# Fills BUNDLE (default .whl/ in the checkout, ignored by git) with what a CUDA PyTorch image of Python 3.12
# (the lent GPU machine's: torch 2.11, numpy 2.x, sacrebleu, regex, tqdm, pyyaml; no network) lacks to run
# fairseq beside nmt, so that gpu_check.sh's fairseq step installs it there with
#
#     python3 -m pip install --no-index --no-deps --target /tmp/fairseq-site BUNDLE/*.whl
#
#     bash benchmarks/fairseq_bundle.sh [BUNDLE]       # needs network; BUILD_VENV is kept for the next run
#
# fairseq 0.12.2 does not build on Python >= 3.11; fairseq-fixed 0.12.3.1 (its maintained fork) has only an
# sdist, so it is built here into a cp312 wheel, in BUILD_VENV (a Python 3.12 venv, default
# ${TMPDIR:-/tmp}/fairseq-build-py312) holding torch 2.11 and numpy 2.x as the GPU image does: its C++
# extensions (libbase, libnat) link against that torch and its cython ones against numpy 2's headers, so the
# wheel matches the image and no other torch. No CUDA_HOME: the CUDA extensions (libnat_cuda, ngram repeat
# blocking) are used by neither training nor beam search of a transformer. The build takes
# --no-build-isolation --no-deps (an isolated build would fetch another torch; its torchaudio requirement
# only serves speech tasks). benchmarks/fairseq-bundle/patch_fairseq.py changes the source before the build:
#   - torch >= 2.6 loads checkpoints with weights_only=True, which refuses fairseq's (argparse and omegaconf
#     objects inside; the peer harness ran fairseq-generate with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1): the
#     patch passes weights_only=False where fairseq loads its own files;
#   - fairseq 0.12's --bf16 implies --tpu, and fails on a CUDA device without torch_xla: with CUDA present
#     the patch leaves --tpu off, so that --bf16 trains on the GPU (bf16 weights, float32 master copy);
#   - numpy 2 removed np.int and np.float: two mask helpers and a CRF layer used them (not on a transformer's
#     path, patched so that no import-time surprise waits on another task).
# The dependencies the image lacks, each a wheel for cp312 manylinux: hydra-core 1.3.2 and omegaconf 2.3.0
# (the versions fairseq pins), antlr4-python3-runtime 4.9.3 (omegaconf's grammar; an sdist only, built here
# into a pure-Python wheel) and bitarray. Everything else fairseq imports on a transformer's path is in the
# image (KINDS.md's package list). The whole is about 12 MiB; the device tool carries at most 64 MiB.
#
# Proven on this CPU machine in a twin of the GPU image (a Python 3.12 venv with torch 2.11.0, numpy 2.5.2,
# sacrebleu, sentencepiece, regex, tqdm, pyyaml, click, rich, scikit-learn: benchmarks/fairseq-bundle/README.md)
# with
#     PYTHON=TWIN/bin/python DRY_RUN=1 STEPS=fairseq bash benchmarks/gpu_check.sh OUT
# which installs BUNDLE as above and trains and translates with fairseq and nmt at tiny sizes on the CPU.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE=${1:-$repo/.whl}
BUILD_VENV=${BUILD_VENV:-${TMPDIR:-/tmp}/fairseq-build-py312}
PYTHON312=${PYTHON312:-$(command -v python3.12 || echo "$HOME/.pyenv/versions/3.12.1/bin/python3")}
FAIRSEQ_VERSION=0.12.3.1
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
NUMPY_VERSION=${NUMPY_VERSION:-2.5.2}
# wheels for the image's interpreter whatever this machine's is
platform_args=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

mkdir -p "$BUNDLE"
BUNDLE=$(cd "$BUNDLE" && pwd)
if [ ! -x "$BUILD_VENV/bin/python" ]; then
    "$PYTHON312" -m venv "$BUILD_VENV"
fi
pip=("$BUILD_VENV/bin/python" -m pip --disable-pip-version-check)
# torch as the image has it (from PyPI: the CUDA build, about 4 GB with the NVIDIA libraries it needs to
# import even on a CPU)
if ! "$BUILD_VENV/bin/python" -c "import torch, numpy; assert torch.__version__.startswith('$TORCH_VERSION') \
        and numpy.__version__ == '$NUMPY_VERSION'" 2>/dev/null; then
    "${pip[@]}" install -q "torch==$TORCH_VERSION" "numpy==$NUMPY_VERSION"
fi
"${pip[@]}" install -q cython wheel "setuptools<82" packaging

work=$(mktemp -d "${TMPDIR:-/tmp}/fairseq-bundle-XXXXXX")
trap 'rm -rf "$work"' EXIT
# the sdist (its metadata step imports torch, hence the build venv's pip without isolation)
"${pip[@]}" download -q --no-deps --no-binary :all: --no-build-isolation "fairseq-fixed==$FAIRSEQ_VERSION" -d "$work"
tar xzf "$work/fairseq_fixed-$FAIRSEQ_VERSION.tar.gz" -C "$work"
src=$work/fairseq_fixed-$FAIRSEQ_VERSION
"${pip[0]}" "$repo/benchmarks/fairseq-bundle/patch_fairseq.py" "$src"
rm -f "$BUNDLE"/fairseq_fixed-*.whl
(cd "$src" && env -u CUDA_HOME MAX_JOBS="${MAX_JOBS:-2}" "${pip[@]}" wheel -q --no-build-isolation --no-deps \
    -w "$work" .)
# the extensions without their debug symbols (Python's CFLAGS carry -g): 10 MiB each before, 0.2 MiB after
"${pip[0]}" -m wheel unpack "$work"/fairseq_fixed-*.whl -d "$work/unpacked"
find "$work/unpacked" -name '*.so' -exec strip --strip-debug {} +
"${pip[0]}" -m wheel pack "$work/unpacked/fairseq_fixed-$FAIRSEQ_VERSION" -d "$BUNDLE"

# antlr4-python3-runtime 4.9.3 has no wheel on PyPI: a pure-Python one built from its sdist
rm -f "$BUNDLE"/antlr4_python3_runtime-*.whl
"${pip[@]}" wheel -q --no-deps -w "$BUNDLE" antlr4-python3-runtime==4.9.3
"${pip[@]}" download -q --no-deps "${platform_args[@]}" -d "$BUNDLE" \
    hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3
ls -l "$BUNDLE"
du -sh "$BUNDLE"
