#!/usr/bin/env bash
# 6. Translate newstest2014: beam 4, GNMT length penalty alpha 0.6, maximum output length input + 50.
here=$(cd "$(dirname "$0")" && pwd); source "$here/env.sh"; source "$here/../wmt14/common.sh"
hyp=$WORK_DIR/test-$ARCH.hyp.$TGT
[ -f "$hyp" ] && [ "$hyp" -nt "$WORK_DIR/average-$ARCH.pt" ] && { echo "06_generate: $hyp is up to date; skipping" >&2; exit 0; }
run sh -c "nmt generate --path '$WORK_DIR/average-$ARCH.pt' --input '$WORK_DIR/clean/test.$SRC' --beam 4 --lenpen 0.6 \
    --lenpen-style gnmt --max-len-a 1 --max-len-b 50 ${DEVICE_FLAGS[*]} > '$hyp.tmp' && mv '$hyp.tmp' '$hyp'"
