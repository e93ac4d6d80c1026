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


def raw_text_problem(text: str, pieces: bool = False) -> str | None:
    """Why `nmt generate` (a line of --input) and `nmt serve` (a text of a request) cannot translate a text, or
    None: it is no Unicode (an unpaired surrogate has no UTF-8), or it is already split into sentencepiece pieces
    (fairseq-interactive takes BPE'd input; nmt encodes raw text itself, with the checkpoint's own sentencepiece
    model; `pieces`: such a text is what is wanted, `nmt score-pairs --target-format pieces`). The caller names the
    text: `FILE:LINE: the line ...`, `texts[INDEX]: the text ...`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid Unicode (an unpaired surrogate at character {e.start})"
    if not pieces and looks_like_pieces(text):
        return (
            f"holds sentencepiece pieces ({WORD_MARK}); give raw text, which nmt encodes with the checkpoint's own "
            "sentencepiece model"
        )
    return None


def looks_like_pieces(text: str) -> bool:
    """Whether a text reads as sentencepiece's pieces joined by spaces ("▁Ein ▁Mann ▁in ▁eine m"):
    its first token and at least one other start with the word mark, and the mark starts every token that holds it
    (sentencepiece puts it nowhere else). Text that merely holds the character ("press ▁ to continue", a lone
    "▁word") is text; sentencepiece reads each mark in it as a space."""
    tokens = text.split()
    marked = [token for token in tokens if WORD_MARK in token]
    if len(marked) < 2 or not tokens[0].startswith(WORD_MARK):
        return False
    return all(token.startswith(WORD_MARK) and WORD_MARK not in token[1:] for token in marked)
