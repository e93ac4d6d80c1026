# Settings of the EN-FR recipe (sourced by every step).
SRC=en; TGT=fr
VOCAB_SIZE=32000          # the paper's 32k word-piece vocabulary
BIG_DROPOUT=0.1           # transformer_big EN-FR used P_drop = 0.1
WORK_DIR=${WORK_DIR:-$(pwd)/wmt14_en_fr}
DATA_DIR=${DATA_DIR:-$WORK_DIR/raw}
# Corpora (statmt.org): Europarl v7, Common Crawl, UN, News Commentary v9, Giga (10^9) FR-EN; dev newstest2013; test newstest2014.
CORPORA=(
  "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz|training/europarl-v7.fr-en"
  "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz|commoncrawl.fr-en"
  "http://www.statmt.org/wmt13/training-parallel-un.tgz|un/undoc.2000.fr-en"
  "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz|training/news-commentary-v9.fr-en"
  "http://www.statmt.org/wmt10/training-giga-fren.tar|giga-fren.release2.fixed"
)
