"""A tree as a token sequence for the decoder, and back. A constituent is its opening token `(LABEL`, its children, then
`)`; a word is one leaf token. `(S (NP (DT The) (NN cat)) (VP (VBZ sits)) (. .))` becomes

    leaves="pos":   (S (NP DT NN ) (VP VBZ ) . )
    leaves="slot":  (S (NP XX XX ) (VP XX ) . )
    leaves="words": as "pos"; preprocess puts each word's pieces before its tag (copy_constraint.py)
    leaves="words-ahead": as "pos"; each word's pieces right after the previous tag, the first word's at the
                    start: ▁The (S (NP DT ▁cat NN ▁sits ) (VP VBZ ▁. ) . )

With "slot" every POS tag is XX but the punctuation tags EVALB deletes, so that the scorer removes the same words
from both trees. `delinearize` puts the input's own words back at the leaves, in order, as `(TAG word)`."""

from __future__ import annotations

from collections.abc import Sequence

from nmt_cli.parsing.tree import Tree

CLOSE = ")"
SLOT = "XX"
TOP = "TOP"
COPY_MODES = ("words", "words-ahead")  # targets that spell their words (copy_constraint.py)
KEPT_TAGS = frozenset({",", ":", "``", "''", ".", "-LRB-", "-RRB-", "#", "$"})
# Punctuation words whose Penn Treebank tag is fixed by the word itself ("'" is left out: POS or '').
PUNCTUATION_TAGS = {
    ",": ",",
    ".": ".",
    "?": ".",
    "!": ".",
    ":": ":",
    ";": ":",
    "--": ":",
    "...": ":",
    "-": ":",
    "``": "``",
    "`": "``",
    "''": "''",
}
# Brackets in words as the treebank writes them (a raw "(" or ")" leaf would break a tree's format), all
# tagged -LRB- / -RRB- whatever their shape.
BRACKET_ESCAPES = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
PUNCTUATION_TAGS |= {word: "-LRB-" if c in "([{" else "-RRB-" for c, word in BRACKET_ESCAPES.items()}


def is_open(token: str) -> bool:
    return len(token) > 1 and token.startswith("(")


def token_piece(token: str) -> str:
    """A tree token's spelling in the vocabulary, `<TOKEN>`: a sentencepiece control symbol, spelt apart from
    text. A piece's string names one piece only, so a control symbol spelt `,` (the comma's tag) would leave
    the character `,` no piece of its own: every comma, full stop, `$`, `#` and `:` of the text would be `<unk>`."""
    return f"<{token}>"


def piece_token(piece: str) -> str:
    """The tree token a control piece spells (`token_piece`'s inverse); a bare piece is returned as it is (data
    directories and checkpoints made before tree tokens were spelt `<TOKEN>` hold them bare)."""
    return piece[1:-1] if len(piece) > 2 and piece.startswith("<") and piece.endswith(">") else piece


def leaf_token(tag: str, leaves: str) -> str:
    return SLOT if leaves == "slot" and tag not in KEPT_TAGS else tag


def linearize(tree: Tree, leaves: str) -> list[str]:
    """A cleaned tree (see tree.clean) -> tokens. A bare preterminal root is wrapped in TOP."""
    if tree.is_preterminal:
        tree = Tree(TOP, [tree])
    out: list[str] = []

    def walk(node: Tree) -> None:
        if node.is_preterminal:
            out.append(leaf_token(node.label, leaves))
            return
        out.append("(" + node.label)
        for child in node.children:
            walk(child)
        out.append(CLOSE)

    walk(tree)
    return out


def delinearize(tokens: Sequence[str], words: Sequence[str]) -> Tree:
    """Tokens of a well-formed tree with len(words) leaves -> the tree with those words.

    Raises ValueError when the tokens are not such a tree (the search's constraint rules that out).
    """
    stack: list[Tree] = []
    root: Tree | None = None
    n_words = 0
    for tok in tokens:
        if root is not None:
            raise ValueError(f"token {tok!r} after the end of the tree")
        if is_open(tok):
            stack.append(Tree(tok[1:]))
        elif tok == CLOSE:
            if not stack or not stack[-1].children:
                raise ValueError("')' closes nothing or an empty constituent")
            node = stack.pop()
            if stack:
                stack[-1].children.append(node)
            else:
                root = node
        else:
            if not stack or n_words >= len(words):
                raise ValueError(f"leaf {tok!r} outside a constituent or beyond the {len(words)} words")
            stack[-1].children.append(Tree(tok, word=words[n_words]))
            n_words += 1
    if root is None or n_words != len(words):
        raise ValueError(f"not a complete tree over {len(words)} words")
    return root


def with_top(tree: Tree) -> Tree:
    """The output form: one TOP bracket above the root, as EVALB's gold files have (it is not scored)."""
    return tree if tree.label == TOP else Tree(TOP, [tree])


def tag_punctuation(tree: Tree) -> Tree:
    """Give the punctuation words their fixed tag (PUNCTUATION_TAGS), and no other word a punctuation tag
    (it becomes XX; "'" keeps its predicted tag, as it is POS or ''), whatever the decoder predicted.

    EVALB deletes words by their tag in each tree separately, so a comma tagged NN in the output but
    "," in the gold (or a word tagged ",") makes the sentence a length-mismatch error. The tag comes
    from the input word alone.
    """
    punctuation = set(PUNCTUATION_TAGS.values())
    for leaf in tree.preterminals():
        word = leaf.word or ""
        if word in PUNCTUATION_TAGS:
            leaf.label = PUNCTUATION_TAGS[word]
        elif leaf.label in punctuation and word != "'":
            leaf.label = SLOT
    return tree
