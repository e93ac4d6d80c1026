#!/usr/bin/env bash
# The whole GPU verification in one command, for anyone with a CUDA GPU (a user trying nmt on a new card, or a
# session lent one for a few minutes). Every step has a time limit and the whole stops at DEADLINE seconds (540
# by default): a step that would start with less than 20 s left is skipped. Every step together takes longer
# than that on an H200 (benchmarks/README.md), so a short lease runs them as two calls chosen with STEPS.
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]          # logs into OUT_DIR, else $OUT, else gpu-check-DATE
#     DRY_RUN=1 bash benchmarks/gpu_check.sh DIR      # on the CPU at tiny sizes: checks the script itself
#
# OUT_DIR receives 8 files, what the device tool brings back: env.log, tests.log, bench.log (the fairseq
# step's too), profile.log (profile-graphs', profile-generation's and compile's too: all run profile_gpu.py),
# recipe.log, serve.log, results.jsonl (every figure and step time) and summary.md (the table).
# STEPS="tests bench ..." runs only those steps (default: all eight; "fairseq-speed" or "fairseq-quality" runs
# half of the fairseq step); BENCH_ARGS adds arguments to bench_gpu.py (e.g. "--skip-training" where the fairseq
# step measures training). The recipe's data, checkpoints and the `nmt` shim go to WORK (a temporary directory
# unless given). Multi30k is read from RAW_DIR (default ../shared/data/multi30k beside the checkout; the recipe
# step is skipped where it is absent: no downloads).
#
# Steps (a failing step is reported and the others still run; the exit status is 1 if any failed):
#   1. tests      python -m pytest -m gpu (what `make test-gpu` runs)
#   2. bench      benchmarks/bench_gpu.py: train transformer_base and _big (bf16, ~25k target tokens an update),
#                 beam-4 generation of 3,000 sentences
#   3. fairseq    benchmarks/bench_fairseq.py, where FAIRSEQ_BUNDLE (default .whl/ in the checkout, filled by
#                 benchmarks/fairseq_bundle.sh on a machine with network) holds fairseq's wheels: installed into
#                 WORK/fairseq-site, then fairseq and nmt trained alternately on the same data, transformer_base
#                 and _big, same tokens per update and updates: target tok/s, ratio, peak GPU memory; nmt's
#                 base with --bucket-shapes and with the Triton loss off; then (fairseq-quality) both trained
#                 the same number of updates on Multi30k, beam 4 on test_2016_flickr, sacreBLEU of each.
#                 Skipped, with the reason, where the bundle is absent
#   4. profile    benchmarks/profile_gpu.py: GPU busy %, the 10 costliest kernels, host time of the top ops of a
#                 training update; (profile-graphs) of one with --bucket-shapes --cuda-graphs; then
#                 (profile-generation) of a beam-search step, with its kernel and graph
#                 launches, for each of bench_gpu.py's batchings and searches (--generation)
#   5. recipe     recipes/multi30k_en_de trained for TRAIN_MINUTES (2) on the GPU, its sacreBLEU
#   6. serve      benchmarks/bench_serve.py on the recipe's checkpoint (or SERVE_CHECKPOINT's, a model trained
#                 elsewhere, to compare with its CPU figures): `nmt serve` on the GPU under 32
#                 clients and one, next to `nmt generate`; again (serve-slots) with --fixed-slots, the server
#                 and generate both; then benchmarks/profile_serve.py, where a served sentence's time goes
#   7. decoding   benchmarks/bench_decoding.py on the recipe's checkpoint: each decoding feature's time against
#                 plain beam 4, and score-pairs' sentences/s against the search's (issue 49: >= 10x); in bench.log
#   8. compile    --compile's warm-up for transformer_base (8 updates), if time is left before DEADLINE
# then a table (OUT_DIR/summary.md). Runs from this checkout with the packages of a CUDA PyTorch image (torch,
# numpy, sentencepiece, sacrebleu, click, rich, pytest): nothing is installed, `nmt` is `python3 -m nmt_cli`.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=${1:-${OUT:-$repo/gpu-check-$(date +%Y%m%d-%H%M%S)}}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
DEADLINE=${DEADLINE:-540}
TRAIN_MINUTES=${TRAIN_MINUTES:-2}
RAW_DIR=${RAW_DIR:-$(cd "$repo/.." && pwd)/shared/data/multi30k}
STEPS=${STEPS:-tests bench fairseq profile recipe serve decoding compile}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
[ -n "${WORK:-}" ] || { WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXXXX"); made_work=1; }
mkdir -p "$WORK/bin"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
# `nmt` for the recipe, without installing the package
printf '#!/bin/sh\nexec %s -m nmt_cli "$@"\n' "$PYTHON" > "$WORK/bin/nmt"
chmod +x "$WORK/bin/nmt"
RESULTS=$OUT_DIR/results.jsonl
start=$SECONDS
failed=()

log_of() {  # log_of NAME: a step's log file; profile-graphs', profile-generation's and compile's go after profile's,
    # serve-slots' and serve-profile's after serve's and fairseq's and decoding's after bench's, keeping OUT_DIR to 8 files
    case $1 in
        profile-* | compile) echo "$OUT_DIR/profile.log" ;;
        serve-*) echo "$OUT_DIR/serve.log" ;;
        fairseq* | decoding) echo "$OUT_DIR/bench.log" ;;
        *) echo "$OUT_DIR/$1.log" ;;
    esac
}

skipped() {  # skipped NAME REASON
    echo "== $1 skipped: $2" | tee -a "$(log_of "$1")"
    echo "{\"step\": \"$1\", \"skipped\": \"$2\"}" >> "$RESULTS"
}

# step NAME LIMIT_SECONDS COMMAND...: run it with its log in `log_of NAME` and its seconds in results.jsonl
step() {
    local name=$1 limit=$2
    shift 2
    case " $STEPS " in *" ${name%%-*} "*) ;; *) skipped "$name" "not in STEPS"; return ;; esac  # serve-slots, serve-profile: serve's
    local left=$((DEADLINE - (SECONDS - start)))
    if [ "$left" -lt 20 ]; then
        skipped "$name" "$left s left before the $DEADLINE s deadline"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (at most $limit s): $*"
    local t0=$SECONDS
    local log
    log=$(log_of "$name")
    echo "== $name: $*" >> "$log"
    (cd "$repo" && timeout -k 10 "$limit" "$@") >> "$log" 2>&1
    local rc=$?
    echo "{\"step\": \"$name\", \"seconds\": $((SECONDS - t0)), \"rc\": $rc}" >> "$RESULTS"
    tail -n 4 "$log" | sed 's/^/   /'
    [ "$rc" = 0 ] || { echo "   $name FAILED (exit $rc; 124: out of time)"; failed+=("$name"); }
}

# serve_step LIMIT BENCH_ARGS PROFILE_ARGS ARGS...: bench_serve.py on the recipe's checkpoint (the serve extra:
# starlette, uvicorn) with BENCH_ARGS and ARGS, then profile_serve.py on it with PROFILE_ARGS and ARGS (the
# two quoted words are split into arguments)
serve_step() {
    local limit=$1 bench_args=$2 profile_args=$3 checkpoint=${SERVE_CHECKPOINT:-$WORK/multi30k/average.pt}
    shift 3
    if [ ! -f "$checkpoint" ]; then
        skipped serve "no checkpoint at $checkpoint"
    elif ! "$PYTHON" -c 'import starlette, uvicorn' 2>/dev/null; then
        skipped serve "no starlette and uvicorn (pip install starlette uvicorn)"
    else
        # shellcheck disable=SC2086  # the quoted words are arguments
        step serve "$limit" env NMT_BENCH_DIR="$WORK/bench" "$PYTHON" benchmarks/bench_serve.py --path "$checkpoint" \
            $bench_args "$@"
        # shellcheck disable=SC2086
        step serve-slots "$limit" env NMT_BENCH_DIR="$WORK/bench" "$PYTHON" benchmarks/bench_serve.py \
            --path "$checkpoint" --fixed-slots $bench_args "$@"
        # shellcheck disable=SC2086
        step serve-profile 90 "$PYTHON" benchmarks/profile_serve.py --path "$checkpoint" $profile_args "$@"
    fi
}

# decoding_step LIMIT ARGS...: bench_decoding.py on the recipe's checkpoint (or SERVE_CHECKPOINT's) with ARGS
decoding_step() {
    local limit=$1 checkpoint=${SERVE_CHECKPOINT:-$WORK/multi30k/average.pt}
    shift
    if [ ! -f "$checkpoint" ]; then
        skipped decoding "no checkpoint at $checkpoint"
    else
        step decoding "$limit" env NMT_BENCH_DIR="$WORK/bench" "$PYTHON" benchmarks/bench_decoding.py \
            --path "$checkpoint" "$@"
    fi
}

# fairseq_step SPEED_LIMIT QUALITY_LIMIT ARGS...: the carried fairseq wheels installed into WORK/fairseq-site
# (as the device tool's README installs wheels: no index, no dependencies) unless PYTHON imports fairseq
# already, then bench_fairseq.py's speed and quality with ARGS
fairseq_step() {
    local speed_limit=$1 quality_limit=$2 bundle=${FAIRSEQ_BUNDLE:-$repo/.whl} site=$WORK/fairseq-site
    shift 2
    local speed=0 quality=0  # STEPS' "fairseq" runs both, "fairseq-speed" or "fairseq-quality" one
    case " $STEPS " in *" fairseq "* | *" fairseq-speed "*) speed=1 ;; esac
    case " $STEPS " in *" fairseq "* | *" fairseq-quality "*) quality=1 ;; esac
    [ $((speed + quality)) -gt 0 ] || { skipped fairseq "not in STEPS"; return; }
    local STEPS="$STEPS fairseq"  # for step(), which looks for "fairseq" (bash's locals are seen by callees)
    if "$PYTHON" -c "import fairseq_cli.train" 2> /dev/null; then
        echo "== fairseq: $("$PYTHON" -c "import fairseq; print(fairseq.__file__)") (installed)" >> "$(log_of fairseq)"
    elif ! compgen -G "$bundle/fairseq_fixed-*.whl" > /dev/null; then
        skipped fairseq "no fairseq wheel in $bundle (bash benchmarks/fairseq_bundle.sh where pip reaches PyPI)"
        return
    elif ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        skipped fairseq "the wheels in $bundle are for Python 3.12, $PYTHON is $("$PYTHON" -V 2>&1)"
        return
    elif ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$bundle"/*.whl >> "$(log_of fairseq)" 2>&1; then
        skipped fairseq "pip could not install $bundle's wheels (see bench.log)"
        failed+=(fairseq)
        return
    fi
    [ "$speed" = 0 ] || step fairseq "$speed_limit" env PYTHONPATH="$site:$PYTHONPATH" "$PYTHON" \
        benchmarks/bench_fairseq.py speed --results "$RESULTS" "$@"
    if [ "$quality" = 0 ]; then
        :
    elif [ -f "$RAW_DIR/train.en" ]; then
        step fairseq-quality "$quality_limit" env PYTHONPATH="$site:$PYTHONPATH" "$PYTHON" \
            benchmarks/bench_fairseq.py quality --raw-dir "$RAW_DIR" --work "$WORK/fairseq-quality" \
            --results "$RESULTS" "$@"
    else
        skipped fairseq-quality "no Multi30k at RAW_DIR=$RAW_DIR"
    fi
}

: > "$RESULTS"
for name in tests bench profile recipe serve; do : > "$OUT_DIR/$name.log"; done  # the steps append to them
{
    date -u
    git -C "$repo" log -1 --format='commit %H %s' 2>/dev/null
    nvidia-smi 2>/dev/null || echo "no nvidia-smi"
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
        torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")'
} > "$OUT_DIR/env.log" 2>&1
cat "$OUT_DIR/env.log"

if [ "$DRY_RUN" = 1 ]; then  # the same steps at tiny sizes on the CPU (gpu tests skip themselves there)
    step tests 120 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu
    # shellcheck disable=SC2086  # BENCH_ARGS: words
    step bench 120 "$PYTHON" benchmarks/bench_gpu.py --device cpu --results "$RESULTS" ${BENCH_ARGS:-}
    fairseq_step 120 180 --device cpu
    step profile 120 "$PYTHON" benchmarks/profile_gpu.py --device cpu --results "$RESULTS"
    step profile-graphs 60 "$PYTHON" benchmarks/profile_gpu.py --device cpu --bucket-shapes --results "$RESULTS"
    step profile-generation 60 "$PYTHON" benchmarks/profile_gpu.py --generation --device cpu --results "$RESULTS"
    step recipe 60 env DRY_RUN=1 PATH="$WORK/bin:$PATH" WORK_DIR="$WORK/multi30k" RAW_DIR="$RAW_DIR" \
        TRAIN_MINUTES="$TRAIN_MINUTES" bash recipes/multi30k_en_de/run.sh
    serve_step 120 --tiny "--single 4 --rounds 1 --clients 4 --sentences 12 --fixed-slots" --threads 1
    decoding_step 90 --tiny --threads 1 --score-repeat 2
    skipped compile "dry run (tests/test_compile.py's slow test compiles on the CPU)"
else
    step tests 150 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu
    # shellcheck disable=SC2086  # BENCH_ARGS: words
    step bench 150 "$PYTHON" benchmarks/bench_gpu.py --results "$RESULTS" ${BENCH_ARGS:-}
    fairseq_step 190 300  # fairseq's Multi30k run alone took 150 s on the H200
    # a training update's profile, then a search step's
    step profile 45 "$PYTHON" benchmarks/profile_gpu.py --results "$RESULTS"
    step profile-graphs 45 "$PYTHON" benchmarks/profile_gpu.py --cuda-graphs --results "$RESULTS"
    step profile-generation 45 "$PYTHON" benchmarks/profile_gpu.py --generation --results "$RESULTS"
    if [ -f "$RAW_DIR/train.en" ]; then
        step recipe 200 env PATH="$WORK/bin:$PATH" WORK_DIR="$WORK/multi30k" RAW_DIR="$RAW_DIR" \
            TRAIN_MINUTES="$TRAIN_MINUTES" THREADS=8 SHOW=0 bash recipes/multi30k_en_de/run.sh
    else
        skipped recipe "no Multi30k at RAW_DIR=$RAW_DIR (give RAW_DIR=DIR with train, valid, test_2016_flickr .en/.de)"
        failed+=(recipe)
    fi
    # the profile: one sentence at a time, then 32 client threads on the batcher over fixed slots without HTTP
    # beside generate's sorted and arrival-order batches of 32 (the search's ms a step)
    serve_step 150 "" "--single 30 --rounds 2 --clients 32 --sentences 1000 --fixed-slots" --device cuda \
        --input "$RAW_DIR/test_2016_flickr.en"
    # score-pairs reads the searched pairs 10 times over again: runs of about the search's seconds, each paying the
    # process's first CUDA calls once (500 pairs on the H200: 0.36 s, against 1.1 s of search)
    decoding_step 150 --device cuda --rounds 1 --sentences 500 --repeat 10 --score-repeat 10 \
        --input "$RAW_DIR/test_2016_flickr.en"
    if [ $((DEADLINE - (SECONDS - start))) -ge 90 ]; then  # whole or not at all: a cut-short warm-up says nothing
        step compile 90 "$PYTHON" benchmarks/profile_gpu.py --compile-warmup --results "$RESULTS"
    else
        skipped compile "less than 90 s left before the $DEADLINE s deadline"
    fi
fi

"$PYTHON" "$repo/benchmarks/gpu_check_table.py" "$OUT_DIR" "$WORK" $((SECONDS - start)) | tee "$OUT_DIR/summary.md"
[ -z "${made_work:-}" ] || rm -rf "$WORK"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed: ${failed[*]} (logs in $OUT_DIR)"
    exit 1
fi
echo "all steps passed (logs in $OUT_DIR)"
