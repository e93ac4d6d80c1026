#!/usr/bin/env bash
# 7. sacreBLEU with its signature and chrF; also the paper-comparable tokenized BLEU (Moses tokenizer of the
# target language): with compound splitting for EN-DE, plain for EN-FR.
here=$(cd "$(dirname "$0")" && pwd); source "$here/env.sh"; source "$here/../wmt14/common.sh"
metrics=(--metric sacrebleu --metric chrf)
if [ "$TGT" = de ]; then metrics+=(--metric tok-bleu-compound); else metrics+=(--metric tok-bleu); fi
run sh -c "nmt score --sys '$WORK_DIR/test-$ARCH.hyp.$TGT' --ref '$WORK_DIR/clean/test.$TGT' ${metrics[*]} --lang $TGT | tee '$WORK_DIR/score-$ARCH.txt'"
