#!/usr/bin/env bash
# Constituency parsing (paper section 6.3) on the Penn Treebank WSJ sample, on a CPU: preprocess the trees,
# train for TRAIN_MINUTES, parse the valid sentences under the tree constraint, score them with EVALB's
# rules (COLLINS.prm) beside a right-branching baseline. QUICK=1: a tiny model for about a minute (the tests).
# Outputs: $WORK_DIR/valid.hyp.tree (one tree per valid sentence, in order), $WORK_DIR/score.txt.
# Settings and the measured result: README.md here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DATA=${DATA:-$here/../../../shared/data/ptb-sample}
WORK_DIR=${WORK_DIR:-$here/../../work/ptb_parsing}
QUICK=${QUICK:-0}
THREADS=${THREADS:-2}
LEAVES=${LEAVES:-words-ahead}         # words-ahead: each word's pieces (copied) right after the previous tag, so
                                      # the brackets before a word are chosen having read it; words: the pieces
                                      # just before the tag; pos: the tags alone; slot: XX. See README.md
CHECKPOINT=${CHECKPOINT:-average}     # parse with the average of the last N_AVERAGE checkpoints (saved every
                                      # SAVE_MINUTES), or checkpoint_best (lowest valid loss), or checkpoint_last
TRAIN_TREES=${TRAIN_TREES:-0}         # train on the first N trees only (0: all 3,068): the learning curve
if [ "$QUICK" = 1 ]; then
    ARCH=${ARCH:-transformer_tiny}; TRAIN_MINUTES=${TRAIN_MINUTES:-0.25}; VALID_LINES=${VALID_LINES:-40}
    BEAM=${BEAM:-2}; MAX_LEN_B=${MAX_LEN_B:-100}; WARMUP=${WARMUP:-50}; VOCAB=${VOCAB:-1000}; PRECISION=${PRECISION-}
    SAVE_MINUTES=${SAVE_MINUTES:-0.04}; N_AVERAGE=${N_AVERAGE:-2}
else
    ARCH=${ARCH:-transformer_small}; TRAIN_MINUTES=${TRAIN_MINUTES:-30}; VALID_LINES=${VALID_LINES:-0}
    BEAM=${BEAM:-21}; MAX_LEN_B=${MAX_LEN_B:-300}; WARMUP=${WARMUP:-200}; VOCAB=${VOCAB:-4000}
    SAVE_MINUTES=${SAVE_MINUTES:-3}; N_AVERAGE=${N_AVERAGE:-5}
    . "$here/../cpu_precision.sh"    # PRECISION: --bf16 where the CPU has bfloat16 instructions; PRECISION= for float32
fi
DROPOUT=${DROPOUT:-0.3}
MAX_TOKENS=${MAX_TOKENS:-4096}
if command -v nmt >/dev/null; then PYTHON=${PYTHON:-$(dirname "$(command -v nmt)")/python}; else PYTHON=${PYTHON:-python3}; fi
run() { echo "+ $*" >&2; [ "${DRY_RUN:-0}" = 1 ] || "$@"; }
. "$here/../settings.sh"             # check_settings, average_last
[ -f "$DATA/valid.tree" ] || { echo "error: DATA $DATA has no valid.tree; give the treebank sample's directory" >&2; exit 1; }

mkdir -p "$WORK_DIR"
# 1. The splits: the first TRAIN_TREES training trees (0: all; the learning curve), the first VALID_LINES
#    valid sentences (0: all; QUICK mode takes 40).
check_settings "$WORK_DIR/data.settings" \
    "DATA=$DATA TRAIN_TREES=$TRAIN_TREES VALID_LINES=$VALID_LINES VOCAB=$VOCAB LEAVES=$LEAVES"
first() { if [ "$1" -gt 0 ]; then echo "head -n $1"; else echo cat; fi; }
for kind in tree words; do
    run sh -c "$(first "$TRAIN_TREES") '$DATA/train.$kind' > '$WORK_DIR/train.$kind'"
    run sh -c "$(first "$VALID_LINES") '$DATA/valid.$kind' > '$WORK_DIR/valid.$kind'"
done

# 2. Sentences -> linearised trees; tree tokens are single vocabulary items (words: the words' pieces too, so
#    --max-len counts both; no training tree is longer than 600).
[ -f "$WORK_DIR/data-bin/meta.json" ] || run nmt preprocess -s words -t tree --target-format ptb-tree \
    --tree-leaves "$LEAVES" --trainpref "$WORK_DIR/train" --validpref "$WORK_DIR/valid" \
    --destdir "$WORK_DIR/data-bin" --vocab-size "$VOCAB" --workers "$THREADS" --max-len 1000

# 3. Train for TRAIN_MINUTES of wall clock (shared CPU: see README.md).
run nmt train "$WORK_DIR/data-bin" --save-dir "$WORK_DIR/checkpoints" --arch "$ARCH" --dropout "$DROPOUT" \
    --max-tokens "$MAX_TOKENS" --warmup-updates "$WARMUP" --label-smoothing 0.1 \
    --max-time-minutes "$TRAIN_MINUTES" --threads "$THREADS" --log-interval 20 --log-file "$WORK_DIR/train.jsonl" \
    --save-interval-minutes "$SAVE_MINUTES" --keep-last "$N_AVERAGE" $PRECISION

# 4. Parse the valid sentences: beam BEAM, alpha 0.3, max length |x| + MAX_LEN_B, every output a tree.
#    (The paper's beam 21 is also the checkpoint's default; BEAM=4 is about as good here, see README.md.)
ckpt=$WORK_DIR/checkpoints/checkpoint_$CHECKPOINT.pt
if [ "$CHECKPOINT" = average ]; then
    ckpt=$WORK_DIR/average.pt
    average_last "$WORK_DIR/checkpoints" "$N_AVERAGE" "$ckpt" --force
fi
run sh -c "nmt generate --path '$ckpt' --input '$WORK_DIR/valid.words' \
        --beam $BEAM --lenpen 0.3 --max-len-a 1 --max-len-b $MAX_LEN_B --threads $THREADS \
        > '$WORK_DIR/valid.hyp.tree.tmp' && mv '$WORK_DIR/valid.hyp.tree.tmp' '$WORK_DIR/valid.hyp.tree'"

# 5. EVALB (COLLINS.prm) F1 of the model and of right-branching trees over the gold POS tags.
run sh -c "'$PYTHON' '$here/baseline.py' '$WORK_DIR/valid.tree' > '$WORK_DIR/valid.baseline.tree'"
# (through .tmp: a failed score leaves the previous report)
run sh -c "nmt score --metric bracket-f1 --sys '$WORK_DIR/valid.hyp.tree' --ref '$WORK_DIR/valid.tree' --verbose \
    > '$WORK_DIR/evalb.txt.tmp' && mv '$WORK_DIR/evalb.txt.tmp' '$WORK_DIR/evalb.txt'"
run sh -c "nmt score --metric bracket-f1 --sys '$WORK_DIR/valid.baseline.tree' --ref '$WORK_DIR/valid.tree' \
    > '$WORK_DIR/evalb.baseline.txt.tmp' && mv '$WORK_DIR/evalb.baseline.txt.tmp' '$WORK_DIR/evalb.baseline.txt'"
field() { grep -m1 "^$2 " "$1" | awk '{ print $NF }'; }  # the summary's first (all sentences) value
summary() {
    echo "bracket F1 = $(field "$1" "Bracketing FMeasure"), complete match = $(field "$1" "Complete match")," \
        "tagging accuracy = $(field "$1" "Tagging accuracy")"
}
[ "${DRY_RUN:-0}" = 1 ] || {
    echo "model: $(summary "$WORK_DIR/evalb.txt") (EVALB COLLINS.prm, all sentences; $ARCH, $TRAIN_MINUTES min)"
    echo "right-branching baseline: $(summary "$WORK_DIR/evalb.baseline.txt")"
} | tee "$WORK_DIR/score.txt"
