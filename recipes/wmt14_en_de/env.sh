# Settings of the EN-DE recipe (sourced by every step).
SRC=en; TGT=de
VOCAB_SIZE=37000          # joint BPE vocabulary of the paper
BIG_DROPOUT=0.3           # transformer_big EN-DE used P_drop = 0.3
WORK_DIR=${WORK_DIR:-$(pwd)/wmt14_en_de}
DATA_DIR=${DATA_DIR:-$WORK_DIR/raw}
# Corpora (statmt.org): Europarl v7, Common Crawl, News Commentary v9; dev newstest2013; test newstest2014 (full, 3,003 lines).
CORPORA=(
  "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz|training/europarl-v7.de-en"
  "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz|commoncrawl.de-en"
  "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz|training/news-commentary-v9.de-en"
)
