#!/usr/bin/env bash
# The paper's Table 3 (variations on the Transformer) at small scale on Multi30k EN->DE: every row of
# rows.txt trains transformer_small with that row's flags for the same MINUTES_PER_ROW of wall clock,
# then its last checkpoints are averaged, the valid split translated (beam 4) and scored, and
# table.py prints the table in the paper's layout. Each step skips itself when its output exists.
# QUICK=1: one minute per row, rows marked quick only. Settings and a measured table: README.md here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RAW_DIR=${RAW_DIR:-$here/../../../shared/data/multi30k}
WORK_DIR=${WORK_DIR:-$here/../../work/table3}
QUICK=${QUICK:-0}
MINUTES_PER_ROW=${MINUTES_PER_ROW:-$([ "$QUICK" = 1 ] && echo 1 || echo 3)}
ROWS=${ROWS:-}                  # space-separated row names (default: all, or the quick ones)
THREADS=${THREADS:-1}
ARCH=${ARCH:-transformer_small}
VOCAB=${VOCAB:-8000}
MAX_TOKENS=${MAX_TOKENS:-2048}        # small batches: more updates in a few minutes
WARMUP=${WARMUP:-50}              # warmup and peak lr (noam: lr_scale * d_model^-0.5 * warmup^-0.5)
LR_SCALE=${LR_SCALE:-0.25}        # suit budgets of a few hundred updates; raise WARMUP for longer ones
N_AVERAGE=${N_AVERAGE:-2}
MAX_LEN_A=${MAX_LEN_A:-1.5}       # translations stop at 1.5 x source + 5 pieces (the paper: source + 50),
MAX_LEN_B=${MAX_LEN_B:-5}         # so the barely trained models of short rows do not babble for minutes
. "$here/../cpu_precision.sh"        # PRECISION: --bf16 where the CPU has bfloat16 instructions, else float32
PYTHON=${PYTHON:-$(dirname "$(command -v nmt)")/python}
run() { echo "+ $*" >&2; [ "${DRY_RUN:-0}" = 1 ] || "$@"; }
. "$here/../settings.sh"             # check_settings, average_last

# The rows to run: NAME and flags from rows.txt, filtered by ROWS or QUICK.
selected=()
while read -r name rest; do
    case "$name" in ''|'#'*) continue ;; esac
    if [ -n "$ROWS" ]; then [[ " $ROWS " == *" $name "* ]] || continue
    elif [ "$QUICK" = 1 ]; then [[ " $rest " == *" quick "* ]] || continue
    fi
    selected+=("$name ${rest/quick/}")
done < "$here/rows.txt"
[ ${#selected[@]} -gt 0 ] || { echo "no rows selected (ROWS='$ROWS')" >&2; exit 1; }
for name in $ROWS; do  # a misspelt row would otherwise be left out without a word
    awk -v n="$name" '$1 == n { found = 1 } END { exit !found }' "$here/rows.txt" || { echo "error: ROWS: no row '$name' in $here/rows.txt" >&2; exit 1; }
done

# 1. The Multi30k recipe's data: joint 8k sentencepiece vocabulary, binarized train/valid.
mkdir -p "$WORK_DIR"
check_settings "$WORK_DIR/data-bin.settings" "VOCAB=$VOCAB RAW_DIR=$RAW_DIR"
[ -f "$WORK_DIR/data-bin/meta.json" ] || run nmt preprocess -s en -t de \
    --trainpref "$RAW_DIR/train" --validpref "$RAW_DIR/valid" \
    --destdir "$WORK_DIR/data-bin" --vocab-size "$VOCAB" --max-len-ratio 3 --workers "$THREADS"

# 2. Each row: train for MINUTES_PER_ROW, average the checkpoints at 80% and 100% of it (N_AVERAGE),
#    translate valid (beam 4, alpha 0.6) and score it with sacreBLEU.
SAVE_MINUTES=$(awk "BEGIN { print $MINUTES_PER_ROW * 0.8 }")
for row in "${selected[@]}"; do
    read -r name flags <<< "$row"
    dir=$WORK_DIR/rows/${name//:/_}
    # A row's results stand for its flags and these settings: another run asking for other ones stops.
    check_settings "$dir/settings" "$flags | ARCH=$ARCH MINUTES_PER_ROW=$MINUTES_PER_ROW MAX_TOKENS=$MAX_TOKENS LR_SCALE=$LR_SCALE WARMUP=$WARMUP N_AVERAGE=$N_AVERAGE"
    if [ ! -f "$dir/done" ]; then  # an interrupted row resumes from its checkpoint_last.pt
        run mkdir -p "$dir"
        # shellcheck disable=SC2086  # the row's flags are words
        run nmt train "$WORK_DIR/data-bin" --save-dir "$dir/checkpoints" --arch "$ARCH" $flags \
            --max-tokens "$MAX_TOKENS" --lr-scale "$LR_SCALE" --warmup-updates "$WARMUP" \
            --max-time-minutes "$MINUTES_PER_ROW" --save-interval-minutes "$SAVE_MINUTES" \
            --threads "$THREADS" --log-interval 10 --log-file "$dir/train.jsonl" $PRECISION
        average_last "$dir/checkpoints" "$N_AVERAGE" "$dir/average.pt"
        run nmt generate "$WORK_DIR/data-bin" --gen-subset valid --path "$dir/average.pt" --beam 4 --lenpen 0.6 \
            --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" \
            --threads "$THREADS" --results-path "$dir"
        run sh -c "nmt score --sys '$dir/generate-valid.txt' --ref '$RAW_DIR/valid.de' --json > '$dir/score.json'"
        [ "${DRY_RUN:-0}" = 1 ] || echo "$name $flags" > "$dir/done"
    fi
done
[ "${DRY_RUN:-0}" = 1 ] && exit 0

# 3. The table, in the paper's layout (blank: as in the base row).
names=(); for row in "${selected[@]}"; do names+=("${row%% *}"); done
"$PYTHON" "$here/table.py" "$WORK_DIR" "${names[@]}" --minutes "$MINUTES_PER_ROW" | tee "$WORK_DIR/table.md"
