#!/usr/bin/env bash
# 3. One joint sentencepiece BPE vocabulary (37k EN-DE, 32k EN-FR) and binarized data.
here=$(cd "$(dirname "$0")" && pwd); source "$here/env.sh"; source "$here/../wmt14/common.sh"
[ -f "$WORK_DIR/data-bin/meta.json" ] && { echo "03_preprocess: data-bin exists; skipping" >&2; exit 0; }
vocab=$( [ "$SMOKE" = 1 ] && echo "$VOCAB" || echo "$VOCAB_SIZE" )
run nmt preprocess -s "$SRC" -t "$TGT" --trainpref "$WORK_DIR/clean/train" --validpref "$WORK_DIR/clean/valid" \
    --testpref "$WORK_DIR/clean/test" --destdir "$WORK_DIR/data-bin" --vocab-size "$vocab" --model-type bpe \
    --max-len 400 --max-len-ratio 3 --workers "$(nproc)"
