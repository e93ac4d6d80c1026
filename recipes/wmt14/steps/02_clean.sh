#!/usr/bin/env bash
# 2. Clean the training data: keep pairs of 1-250 words a side with a length ratio <= 1.5 (as Moses' clean-corpus-n.perl).
here=$(cd "$(dirname "$0")" && pwd); source "$here/env.sh"; source "$here/../wmt14/common.sh"
out=$WORK_DIR/clean
[ -s "$out/train.$TGT" ] && { echo "02_clean: $out exists; skipping" >&2; exit 0; }
run mkdir -p "$out"
run sh -c "paste '$DATA_DIR/train.$SRC' '$DATA_DIR/train.$TGT' | awk -F'\t' 'NF == 2 {
    s = split(\$1, a, \" \"); t = split(\$2, b, \" \");
    if (s >= 1 && t >= 1 && s <= 250 && t <= 250 && s <= 1.5 * t && t <= 1.5 * s) print }' > '$out/pairs.tsv'"
run sh -c "cut -f1 '$out/pairs.tsv' > '$out/train.$SRC' && cut -f2 '$out/pairs.tsv' > '$out/train.$TGT' && rm '$out/pairs.tsv'"
for split in valid test; do for l in $SRC $TGT; do run cp "$DATA_DIR/$split.$l" "$out/$split.$l"; done; done
