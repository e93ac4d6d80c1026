#!/usr/bin/env bash
# Multi30k EN->DE on a CPU or a GPU: preprocess, train for TRAIN_MINUTES of wall clock, average the last
# checkpoints, translate test_2016_flickr with beam 4, score it with sacreBLEU and draw the learning curve.
# Each step skips itself when its output exists. Settings and measured results: README.md here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
RAW_GIVEN=${RAW_DIR:+1}
RAW_DIR=${RAW_DIR:-$(cd "$repo/.." && pwd)/shared/data/multi30k}
WORK_DIR=${WORK_DIR:-$repo/work/multi30k_en_de}
# Where nvidia-smi lists a GPU, nmt trains and translates on it (--device auto, bf16 there) and 2 minutes of
# training stand for the CPU's 60 (README.md: what they reach).
if [ -z "${TRAIN_MINUTES:-}" ] && nvidia-smi -L > /dev/null 2>&1; then
    TRAIN_MINUTES=2
    echo "a GPU is present (nvidia-smi -L): training for TRAIN_MINUTES=2" >&2
fi
TRAIN_MINUTES=${TRAIN_MINUTES:-60}
THREADS=${THREADS:-2}
ARCH=${ARCH:-transformer_small}
LAYERS=${LAYERS:-3}                  # encoder and decoder layers each (transformer_small's 3)
VOCAB=${VOCAB:-8000}
MAX_TOKENS=${MAX_TOKENS:-4096}
N_AVERAGE=${N_AVERAGE:-5}
DROPOUT=${DROPOUT:-0.2}
WARMUP=${WARMUP:-1000}
LR_SCALE=${LR_SCALE:-1}
SAVE_MINUTES=${SAVE_MINUTES:-$(awk "BEGIN { print $TRAIN_MINUTES / 12 }")}
SHOW=${SHOW:-5}
LOG_INTERVAL=${LOG_INTERVAL:-50}
. "$here/../cpu_precision.sh"        # PRECISION: --bf16 where the CPU has bfloat16 instructions, else float32
. "$here/../settings.sh"             # check_settings, average_last
run() { echo "+ $*" >&2; [ "${DRY_RUN:-0}" = 1 ] || "$@"; }

mkdir -p "$WORK_DIR"
# 1. Data: the shared copy, or the same files from the Multi30k project's repository.
if [ ! -f "$RAW_DIR/train.en" ]; then
    # into RAW_DIR when it was given (its files were looked for there), else beside the work
    if [ -n "$RAW_GIVEN" ]; then echo "RAW_DIR $RAW_DIR has no train.en: downloading Multi30k into it" >&2
    else RAW_DIR=$WORK_DIR/raw; fi
    url=https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw
    mkdir -p "$RAW_DIR"
    for split in train:train val:valid test_2016_flickr:test_2016_flickr; do
        for lang in en de; do
            file=$RAW_DIR/${split#*:}.$lang  # through FILE.part, so that a failed download is fetched again
            [ -f "$file" ] && continue
            run sh -c "curl -fsSL $url/${split%%:*}.$lang.gz | gunzip > '$file.part'" \
                || { echo "error: could not download Multi30k (no network?); give RAW_DIR=DIR with its files" >&2; exit 1; }
            run mv "$file.part" "$file"
        done
    done
fi

# 2. Joint sentencepiece vocabulary and binarized data.
check_settings "$WORK_DIR/data-bin.settings" "VOCAB=$VOCAB RAW_DIR=$RAW_DIR"
[ -f "$WORK_DIR/data-bin/meta.json" ] || run nmt preprocess -s en -t de \
    --trainpref "$RAW_DIR/train" --validpref "$RAW_DIR/valid" --testpref "$RAW_DIR/test_2016_flickr" \
    --destdir "$WORK_DIR/data-bin" --vocab-size "$VOCAB" --max-len-ratio 3 --workers "$THREADS"

# 3. Train for TRAIN_MINUTES, a numbered checkpoint every SAVE_MINUTES, 1/12 of the budget unless given (the paper:
# every 10 minutes).
run nmt train "$WORK_DIR/data-bin" --save-dir "$WORK_DIR/checkpoints" --arch "$ARCH" \
    --encoder-layers "$LAYERS" --decoder-layers "$LAYERS" --max-tokens "$MAX_TOKENS" --lr-scale "$LR_SCALE" \
    --warmup-updates "$WARMUP" --label-smoothing 0.1 \
    --max-time-minutes "$TRAIN_MINUTES" --save-interval-minutes "$SAVE_MINUTES" --threads "$THREADS" \
    --dropout "$DROPOUT" --log-interval "$LOG_INTERVAL" --log-file "$WORK_DIR/train.jsonl" $PRECISION

# 4. Average the last N_AVERAGE numbered checkpoints (again when N_AVERAGE changed: average.n records it).
if [ ! -f "$WORK_DIR/average.pt" ] || [ ! "$WORK_DIR/average.pt" -nt "$WORK_DIR/checkpoints/checkpoint_last.pt" ] \
    || [ "$(cat "$WORK_DIR/average.n" 2>/dev/null)" != "$N_AVERAGE" ]; then
    average_last "$WORK_DIR/checkpoints" "$N_AVERAGE" "$WORK_DIR/average.pt"
    [ "${DRY_RUN:-0}" = 1 ] || echo "$N_AVERAGE" > "$WORK_DIR/average.n"
fi

# 5. Translate the test set (beam 4, GNMT length penalty 0.6, max length input + 50), then score.
[ -f "$WORK_DIR/test.hyp.de" ] && [ "$WORK_DIR/test.hyp.de" -nt "$WORK_DIR/average.pt" ] || \
    run sh -c "nmt generate --path '$WORK_DIR/average.pt' --input '$RAW_DIR/test_2016_flickr.en' --beam 4 \
        --lenpen 0.6 --max-len-a 1 --max-len-b 50 --threads $THREADS > '$WORK_DIR/test.hyp.de.tmp' \
        && mv '$WORK_DIR/test.hyp.de.tmp' '$WORK_DIR/test.hyp.de'"
run sh -c "nmt score --sys '$WORK_DIR/test.hyp.de' --ref '$RAW_DIR/test_2016_flickr.de' > '$WORK_DIR/score.txt.tmp' \
    && mv '$WORK_DIR/score.txt.tmp' '$WORK_DIR/score.txt' && cat '$WORK_DIR/score.txt'"

# 6. The learning curve: losses, learning rate and speed against updates and wall clock (needs matplotlib).
if "$(dirname "$(command -v nmt)")/python" -c "import matplotlib" 2>/dev/null; then
    run nmt plot curves --log-file "$WORK_DIR/train.jsonl" --label "$ARCH" --output "$WORK_DIR/curve.png"
else
    echo "skipping the learning curve: matplotlib is not installed (pip install \"nmt[plot]\")" >&2
fi

# 7. A few test sentences: source, reference, ours.
if [ "${DRY_RUN:-0}" != 1 ] && [ "$SHOW" -gt 0 ]; then
    echo
    # awk reads to the end (no early exit), so paste never dies of SIGPIPE under pipefail
    paste "$RAW_DIR/test_2016_flickr.en" "$RAW_DIR/test_2016_flickr.de" "$WORK_DIR/test.hyp.de" |
        awk -F'\t' -v n="$SHOW" 'NR <= n { printf "source:      %s\nreference:   %s\ntranslation: %s\n\n", $1, $2, $3 }'
fi
