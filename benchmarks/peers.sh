#!/usr/bin/env bash
# `make bench-peers`: nmt side by side with fairseq and CTranslate2 in one run on this machine, with the
# harness in ../shared/peer-bench (its README describes the method). Installs the peers it lacks first
# (about 5 minutes and 2 GB under $PEERS_ROOT, default ~/.cache/nmt-peers). Run nothing else meanwhile.
# The table it prints (and writes to $BENCH_WORK/runs/<date>/summary.md) is what benchmarks/README.md and benchmarks/record/ quote.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PEER_BENCH=${PEER_BENCH:-$(cd "$repo/.." && pwd)/shared/peer-bench}
PEERS_ROOT=${PEERS_ROOT:-$HOME/.cache/nmt-peers}
export PEERS_ROOT
[ -x "$PEER_BENCH/bench.sh" ] || { echo "error: no peer harness at $PEER_BENCH (set PEER_BENCH)" >&2; exit 1; }

for peer in benchtools:benchtools fairseq:fairseq_fixed ct2:ct2; do
    venv=${peer%%:*} script=${peer#*:}
    [ -x "$PEERS_ROOT/$venv/bin/python" ] || bash "$PEER_BENCH/install/install_$script.sh"
done

export NMT_CMD=${NMT_CMD:-$repo/.venv/bin/nmt}
# nmt --bf16 only where the CPU has bf16 instructions: elsewhere it runs emulated, ~30x slower than float32
# (a transformer_small update took about a minute on an AVX2-only AMD Zen 3), and the run would take hours.
runners=${RUNNERS:-}
if [ -z "$runners" ]; then
    runners="fairseq ct2:float32 ct2:int8 nmt"
    if "$repo/.venv/bin/python" -c "import sys; from nmt_cli.runtime import cpu_has_bf16; sys.exit(not cpu_has_bf16())"; then
        runners="$runners nmt:bf16"
    else
        echo "peers.sh: this CPU has no bf16 instructions; nmt:bf16 left out (set RUNNERS to force it)" >&2
    fi
fi
# ROUNDS=N runs the runner list N times over, alternating the toolkits, for machines whose speed drifts
# between stages (the summary then gives each figure's range over the rounds).
all=()
for _ in $(seq "${ROUNDS:-1}"); do all+=($runners); done
export SMALL_WARM=${SMALL_WARM:-30} SMALL_MEAS=${SMALL_MEAS:-40} BASE_WARM=${BASE_WARM:-8} BASE_MEAS=${BASE_MEAS:-10}
exec "$PEER_BENCH/bench.sh" -s "${STAGES:-train:small train:base gen:small:fixed gen:base:fixed}" \
    "${all[@]}"
