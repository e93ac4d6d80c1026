"""Text in, memory-mapped token ids and token-budget batches out."""

# Sentencepiece's mark on a piece that starts a word: text holding it is already split into pieces. Here, not
# in vocab.py, so that `nmt score` checks for it without importing sentencepiece and numpy.
WORD_MARK = "\u2581"
# A byte-order mark some editors put at the start of a UTF-8 file: not text, so `score` and `generate` drop it.
BOM = "\ufeff"


def split_lines(text: str) -> list[str]:
    """Lines as `wc -l`, sentencepiece and sacreBLEU see them: split at "\\n" only, a "\\r" before it dropped.

    str.splitlines also splits at a lone "\\r", form feeds, U+2028 and other separators inside a line (and a
    text-mode file at a lone "\\r"): one stray in a corpus line would misalign every line after it.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]
