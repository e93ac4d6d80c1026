# Shared by the WMT14 recipes: settings from the environment, DRY_RUN and SMOKE handling, and run().
# Sourced by each numbered step; every step skips itself when its output exists.
set -euo pipefail
RECIPES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHARED=${SHARED:-$RECIPES/../../../shared/data}
ARCH=${ARCH:-base}
GPUS=${GPUS:-$( (command -v nvidia-smi >/dev/null && nvidia-smi -L | wc -l) || echo 0)}
SMOKE=${SMOKE:-0}
DRY_RUN=${DRY_RUN:-0}

run() {
    echo "+ $*" >&2
    if [ "$DRY_RUN" != 1 ]; then "$@"; fi
}

# download URL FILE: through FILE.part, renamed when complete, so that an interrupted download is fetched
# again rather than taken for a finished one (the steps skip what exists).
download() {
    [ -f "$2" ] && return 0
    run curl -fL -o "$2.part" "$1" || { echo "error: could not download $1 (no network?)" >&2; exit 1; }
    run mv "$2.part" "$2"
}

# The paper's setting for each size; SMOKE=1 shrinks everything to a few minutes on a CPU.
if [ "$SMOKE" = 1 ]; then
    ARCH_FLAGS=(--arch transformer_tiny --dropout 0.1)
    MAX_UPDATE=${MAX_UPDATE:-30}; SAVE_FLAGS=(--save-interval-updates 10); N_AVERAGE=${N_AVERAGE:-2}
    MAX_TOKENS=${MAX_TOKENS:-1024}; UPDATE_FREQ=${UPDATE_FREQ:-1}; WARMUP=${WARMUP:-10}
    VOCAB=${SMOKE_VOCAB:-1000}; DEVICE_FLAGS=(--device cpu --threads 2)
elif [ "$ARCH" = big ]; then
    ARCH_FLAGS=(--arch transformer_big --dropout "${BIG_DROPOUT}")
    MAX_UPDATE=${MAX_UPDATE:-300000}; SAVE_FLAGS=(--save-interval-minutes 10); N_AVERAGE=${N_AVERAGE:-20}
    WARMUP=${WARMUP:-4000}; DEVICE_FLAGS=()
else
    ARCH_FLAGS=(--arch transformer_base --dropout 0.1)
    MAX_UPDATE=${MAX_UPDATE:-100000}; SAVE_FLAGS=(--save-interval-minutes 10); N_AVERAGE=${N_AVERAGE:-5}
    WARMUP=${WARMUP:-4000}; DEVICE_FLAGS=()
fi
# The paper's batches held ~25,000 source and ~25,000 target tokens (8 P100s). With --max-tokens per GPU:
#   GPUS * MAX_TOKENS * UPDATE_FREQ ~= 25,000, e.g. 8 GPUs * 3,125 * 1, or 1 GPU * 3,125 * 8.
if [ "$SMOKE" != 1 ]; then
    MAX_TOKENS=${MAX_TOKENS:-3125}
    UPDATE_FREQ=${UPDATE_FREQ:-$(( 8 / (GPUS > 0 ? (GPUS < 8 ? GPUS : 8) : 1) ))}
fi

# The data steps skip outputs that exist: a WORK_DIR prepared for SMOKE=1 (a slice, a 1,000-piece vocabulary)
# or from another DATA_DIR must not feed a full run. (The model's settings are checked by nmt train itself.)
. "$RECIPES/../settings.sh"
check_settings "$WORK_DIR/data.settings" "SMOKE=$SMOKE DATA_DIR=$DATA_DIR VOCAB=${VOCAB:-$VOCAB_SIZE}"
