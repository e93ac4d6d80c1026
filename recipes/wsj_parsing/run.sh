#!/usr/bin/env bash
# The paper's parsing setup (section 6.3) on the WSJ part of the Penn Treebank: train on sections 02-21
# (about 40k sentences), choose on 22, test on 23. The treebank is licensed (LDC99T42) and cannot be
# downloaded: give TREEBANK=/path/to/treebank_3/parsed/mrg/wsj (the directory with 00 ... 24).
# transformer_parse (4 + 4 layers, d_model 1024, 16 heads), everything else as the EN-DE base model;
# search: beam 21, alpha 0.3, max length |x| + 300 (the checkpoint's generate defaults).
# DRY_RUN=1 prints the commands without running them (the tests do that). SMOKE=1: the same model and search
# on the treebank sample (DATA, default ../shared/data/ptb-sample; its valid split stands for 22 and 23) for
# MAX_UPDATE=600 updates, a checkpoint every 100: the whole pipeline end to end on one GPU in minutes.
# See README.md here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
SMOKE=${SMOKE:-0}
TREEBANK=${TREEBANK:-}
DATA=${DATA:-$here/../../../shared/data/ptb-sample}
WORK_DIR=${WORK_DIR:-$here/../../work/wsj_parsing$([ "$SMOKE" = 1 ] && echo _smoke)}
GPUS=${GPUS:-1}
MAX_TOKENS=${MAX_TOKENS:-4096}
DROPOUT=${DROPOUT:-0.3}                 # the paper chose dropout, lr and beam on section 22
LEAVES=${LEAVES:-pos}                   # the paper's target; words-ahead: the CPU recipe's (ptb_parsing/README.md)
N_AVERAGE=${N_AVERAGE:-5}
PRECISION=${PRECISION:-}
if [ "$SMOKE" = 1 ]; then
    MAX_UPDATE=${MAX_UPDATE:-600}; VOCAB=${VOCAB:-4000}; WARMUP=${WARMUP:-200}; SAVE="--save-interval-updates 100"
else
    MAX_UPDATE=${MAX_UPDATE:-100000}; VOCAB=${VOCAB:-16000}; WARMUP=${WARMUP:-4000}; SAVE="--save-interval-minutes 10"
fi
if command -v nmt >/dev/null; then PYTHON=${PYTHON:-$(dirname "$(command -v nmt)")/python}; else PYTHON=${PYTHON:-python3}; fi
run() { echo "+ $*" >&2; [ "${DRY_RUN:-0}" = 1 ] || "$@"; }
. "$here/../settings.sh"             # average_last

if [ "$SMOKE" = 1 ]; then
    [ "${DRY_RUN:-0}" = 1 ] || [ -f "$DATA/valid.tree" ] || {
        echo "error: DATA $DATA has no valid.tree; give the treebank sample's directory" >&2; exit 1; }
elif [ "${DRY_RUN:-0}" != 1 ] && [ ! -d "$TREEBANK/02" ]; then
    echo "error: set TREEBANK to the Penn Treebank's parsed/mrg/wsj directory (with sections 00-24); it is licensed (LDC99T42) and not downloaded" >&2
    exit 1
fi
TRAIN_CMD="nmt train"
[ "$GPUS" -gt 1 ] && TRAIN_CMD="torchrun --standalone --nproc_per_node $GPUS -m nmt_cli train"
[ "${DRY_RUN:-0}" = 1 ] || mkdir -p "$WORK_DIR/raw"

# 1. One tree per line (and its words) for train (02-21), dev (22) and test (23); SMOKE: the sample's splits.
for split in train:02:21 dev:22:22 test:23:23; do
    IFS=: read -r name first last <<< "$split"
    [ -f "$WORK_DIR/raw/$name.tree" ] && continue
    if [ "$SMOKE" = 1 ]; then
        for kind in tree words; do
            run cp "$DATA/$([ "$name" = train ] && echo train || echo valid).$kind" "$WORK_DIR/raw/$name.$kind"
        done
    else
        run "$PYTHON" "$here/treebank.py" "$TREEBANK" "$first" "$last" "$WORK_DIR/raw/$name"
    fi
done

# 2. Linearised trees, tree tokens as single vocabulary items.
[ -f "$WORK_DIR/data-bin/meta.json" ] || run nmt preprocess -s words -t tree --target-format ptb-tree \
    --tree-leaves "$LEAVES" --trainpref "$WORK_DIR/raw/train" --validpref "$WORK_DIR/raw/dev" \
    --testpref "$WORK_DIR/raw/test" --destdir "$WORK_DIR/data-bin" --vocab-size "$VOCAB" --max-len 1000

# 3. Train transformer_parse (the base model's optimizer, schedule and label smoothing).
run $TRAIN_CMD "$WORK_DIR/data-bin" --save-dir "$WORK_DIR/checkpoints" --arch transformer_parse \
    --dropout "$DROPOUT" --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --warmup-updates "$WARMUP" \
    --label-smoothing 0.1 $SAVE --keep-last 20 $PRECISION

# 4. Average the last N_AVERAGE checkpoints, parse 22 and 23 with the checkpoint's search settings, score.
average_last "$WORK_DIR/checkpoints" "$N_AVERAGE" "$WORK_DIR/average.pt"
for name in dev test; do
    run sh -c "nmt generate --path '$WORK_DIR/average.pt' --input '$WORK_DIR/raw/$name.words' \
        --beam 21 --lenpen 0.3 --max-len-a 1 --max-len-b 300 > '$WORK_DIR/$name.hyp.tree'"
    run sh -c "nmt score --metric bracket-f1 --sys '$WORK_DIR/$name.hyp.tree' --ref '$WORK_DIR/raw/$name.tree' \
        | tee '$WORK_DIR/score-$name.txt'"
done
