#!/usr/bin/env bash
# 1. Data: train.{src,tgt}, valid (newstest2013) and test (full newstest2014) under DATA_DIR.
#    Skips when DATA_DIR already holds them (the tested path); SMOKE=1 takes slices of ../shared/data.
here=$(cd "$(dirname "$0")" && pwd); source "$here/env.sh"; source "$here/../wmt14/common.sh"
missing=(); for split in train valid test; do for l in $SRC $TGT; do
    [ -s "$DATA_DIR/$split.$l" ] || missing+=("$split.$l")
done; done
[ ${#missing[@]} = 0 ] && { echo "01_download: $DATA_DIR has the data; skipping" >&2; exit 0; }
if [ "$SMOKE" != 1 ] && [ ${#missing[@]} -lt 6 ] && [ ! -d "$DATA_DIR/downloads" ]; then  # one's own, short of files
    echo "error: DATA_DIR $DATA_DIR lacks ${missing[*]} (it needs train, valid and test in $SRC and $TGT)" >&2
    exit 1
fi
run mkdir -p "$DATA_DIR"
if [ "$SMOKE" = 1 ]; then
    if [ "$TGT" = de ]; then train=$SHARED/onmt-sample/train; else train=$SHARED/multi30k/train; fi
    for l in $SRC $TGT; do
        run sh -c "head -n 400 '$train.$l' > '$DATA_DIR/train.$l'"
        run sh -c "head -n 60 '$SHARED/newstest2013/valid.$l' > '$DATA_DIR/valid.$l'"
        run sh -c "sed -n '61,120p' '$SHARED/newstest2013/valid.$l' > '$DATA_DIR/test.$l'"
    done
    exit 0
fi
dl=$DATA_DIR/downloads; run mkdir -p "$dl"
for entry in "${CORPORA[@]}"; do
    url=${entry%%|*}; stem=${entry#*|}
    download "$url" "$dl/$(basename "$url")"
    run tar -xf "$dl/$(basename "$url")" -C "$dl"
done
for gz in "$dl"/*.gz; do [ -e "$gz" ] && run gunzip -kf "$gz"; done  # giga-fren ships gzipped text
for l in $SRC $TGT; do
    files=(); for entry in "${CORPORA[@]}"; do stem=${entry#*|}; files+=("$dl/$stem.$l"); done
    run sh -c "cat ${files[*]} > '$DATA_DIR/train.$l'"
done
download http://www.statmt.org/wmt14/dev.tgz "$dl/dev.tgz"
download http://www.statmt.org/wmt14/test-full.tgz "$dl/test-full.tgz"
run tar -xzf "$dl/dev.tgz" -C "$dl"; run tar -xzf "$dl/test-full.tgz" -C "$dl"
pair=$( [ "$TGT" = de ] && echo deen || echo fren )
for l in $SRC $TGT; do
    run cp "$dl/dev/newstest2013.$l" "$DATA_DIR/valid.$l"
    side=$( [ "$l" = "$SRC" ] && echo src || echo ref )
    # The SGM file holds one <seg id="N">text</seg> per line; keep the text.
    run sh -c "grep '<seg id' '$dl/test-full/newstest2014-$pair-$side.$l.sgm' | sed -e 's/<seg id=\"[0-9]*\">\s*//' -e 's/\s*<\/seg>\s*$//' > '$DATA_DIR/test.$l'"
done
