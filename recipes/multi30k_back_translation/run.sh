#!/usr/bin/env bash
# Back-translation on Multi30k: the first REAL_LINES pairs of train are the parallel data, the rest of its German
# the "monolingual" text (its English withheld). Train DE->EN on the real pairs, translate the German into English
# by sampling, then train EN->DE twice on one data directory, for TRAIN_MINUTES each: on the real pairs only
# (--train-weights bt=0), and on them plus the synthetic pairs with <BT> before their sources (--corpus-tags).
# Both are scored on test_2016_flickr. Each step skips itself when its output exists. Results: README.md here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
RAW_DIR=${RAW_DIR:-$(cd "$repo/.." && pwd)/shared/data/multi30k}
WORK_DIR=${WORK_DIR:-$repo/work/multi30k_back_translation}
TRAIN_MINUTES=${TRAIN_MINUTES:-30}
MAX_UPDATE=${MAX_UPDATE:-0}         # >0: each training stops at this many updates instead (equal updates, any machine)
REAL_LINES=${REAL_LINES:-14500}
TOPK=${TOPK:-10}                    # sampling among the 10 likeliest pieces (0: all; Edunov et al., 2018)
THREADS=${THREADS:-2}
ARCH=${ARCH:-transformer_small}
LAYERS=${LAYERS:-3}
VOCAB=${VOCAB:-8000}
MAX_TOKENS=${MAX_TOKENS:-4096}
WARMUP=${WARMUP:-1000}
LR_SCALE=${LR_SCALE:-1}
DROPOUT=${DROPOUT:-0.3}
. "$here/../cpu_precision.sh"      # PRECISION: --bf16 where the CPU has bfloat16 instructions, else float32
. "$here/../settings.sh"           # check_settings
run() { echo "+ $*" >&2; [ "${DRY_RUN:-0}" = 1 ] || "$@"; }
[ -f "$RAW_DIR/train.de" ] || [ "${DRY_RUN:-0}" = 1 ] || { echo "error: RAW_DIR $RAW_DIR has no Multi30k" >&2; exit 1; }
W=$WORK_DIR
mkdir -p "$W"
check_settings "$W/data.settings" "REAL_LINES=$REAL_LINES VOCAB=$VOCAB TOPK=$TOPK RAW_DIR=$RAW_DIR LAYERS=$LAYERS"
splits=(--validpref "$RAW_DIR/valid" --testpref "$RAW_DIR/test_2016_flickr" --vocab-size "$VOCAB" --max-len-ratio 3)
train() {  # DATA SAVE_DIR [options]: TRAIN_MINUTES of training, a checkpoint_best.pt by valid loss
    local data=$1 save=$2; shift 2
    local stop=(--max-time-minutes "$TRAIN_MINUTES")
    [ "$MAX_UPDATE" = 0 ] || stop=(--max-update "$MAX_UPDATE")
    run nmt train "$data" --save-dir "$save" --arch "$ARCH" --encoder-layers "$LAYERS" --decoder-layers "$LAYERS" \
        --max-tokens "$MAX_TOKENS" --warmup-updates "$WARMUP" --lr-scale "$LR_SCALE" --dropout "$DROPOUT" \
        "${stop[@]}" --threads "$THREADS" --log-interval 50 $PRECISION "$@"
}
translate() {  # CHECKPOINT INPUT OUTPUT [options]
    [ -f "$3" ] && [ "$3" -nt "$1" ] || run sh -c "nmt generate --path '$1' --input '$2' --threads $THREADS \
        --max-len-a 1 --max-len-b 50 ${*:4} > '$3.tmp' && mv '$3.tmp' '$3'"
}

# 1. The real pairs and the monolingual German.
[ -f "$W/mono.de" ] || run sh -c "head -n $REAL_LINES '$RAW_DIR/train.en' > '$W/real.en' && \
    head -n $REAL_LINES '$RAW_DIR/train.de' > '$W/real.de' && tail -n +$((REAL_LINES + 1)) '$RAW_DIR/train.de' > '$W/mono.de'"
# 2. DE->EN on the real pairs; it translates the monolingual German by sampling.
[ -f "$W/de-en/meta.json" ] || run nmt preprocess -s de -t en --trainpref "$W/real" --destdir "$W/de-en" "${splits[@]}"
train "$W/de-en" "$W/de-en-ck"
translate "$W/de-en-ck/checkpoint_best.pt" "$W/mono.de" "$W/bt.en" --beam 1 --sampling --sampling-topk "$TOPK"
[ -f "$W/bt.de" ] || run cp "$W/mono.de" "$W/bt.de"
# 3. EN->DE: one vocabulary over both corpora, <BT> a symbol of its own; real only, then real + tagged synthetic.
[ -f "$W/en-de/meta.json" ] || run nmt preprocess -s en -t de --trainpref "real=$W/real,bt=$W/bt" --tags '<BT>' \
    --destdir "$W/en-de" "${splits[@]}"
for run_name in real bt; do
    if [ $run_name = real ]; then train "$W/en-de" "$W/en-de-real" --train-weights bt=0
    else train "$W/en-de" "$W/en-de-bt" --corpus-tags 'bt=<BT>'; fi
    translate "$W/en-de-$run_name/checkpoint_best.pt" "$RAW_DIR/test_2016_flickr.en" "$W/test-$run_name.hyp.de" --beam 4
    run sh -c "nmt score --sys '$W/test-$run_name.hyp.de' --ref '$RAW_DIR/test_2016_flickr.de' > '$W/score-$run_name.txt.tmp' \
        && mv '$W/score-$run_name.txt.tmp' '$W/score-$run_name.txt' && echo $run_name: && cat '$W/score-$run_name.txt'"
done
