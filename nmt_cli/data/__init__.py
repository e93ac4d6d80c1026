"""Text in, memory-mapped token ids and token-budget batches out."""

# Sentencepiece's mark on a piece that starts a word: text holding it is already split into pieces. Here, not
# in vocab.py, so that `nmt score` checks for it without importing sentencepiece and numpy.
WORD_MARK = "\u2581"
