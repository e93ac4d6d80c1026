#!/usr/bin/env bash
# 7. sacreBLEU with its signature; for EN-DE also the paper-comparable tokenized BLEU with compound splitting.
here=$(cd "$(dirname "$0")" && pwd); source "$here/env.sh"; source "$here/../wmt14/common.sh"
metrics=(--metric sacrebleu --metric chrf)
[ "$TGT" = de ] && metrics+=(--metric tok-bleu-compound)
run sh -c "nmt score --sys '$WORK_DIR/test-$ARCH.hyp.$TGT' --ref '$WORK_DIR/clean/test.$TGT' ${metrics[*]} --lang $TGT | tee '$WORK_DIR/score-$ARCH.txt'"
