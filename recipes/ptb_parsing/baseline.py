"""The trivial baseline of the parsing recipes: right-branching trees over the gold POS tags.

    python recipes/ptb_parsing/baseline.py GOLD.tree > baseline.tree

Every sentence becomes (TOP (S (t1 w1) (S (t2 w2) ... (S (t_n-1 w_n-1) (t_n w_n))))), with the gold
words and tags (-NONE- elements removed), so EVALB scores it with the same words as the gold.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nmt_cli.parsing.linearize import TOP
from nmt_cli.parsing.tree import Tree, clean, read_trees


def right_branching(tree: Tree) -> Tree:
    """A right-branching S chain over the preterminals of a cleaned tree."""
    leaves = [Tree(p.label, word=p.word) for p in tree.preterminals()]
    node = Tree("S", leaves[-2:]) if len(leaves) > 1 else Tree("S", leaves)
    for leaf in reversed(leaves[:-2]):
        node = Tree("S", [leaf, node])
    return Tree(TOP, [node])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python recipes/ptb_parsing/baseline.py GOLD.tree > baseline.tree", file=sys.stderr)
        return 2
    for tree in read_trees(Path(argv[0])):
        cleaned = clean(tree)
        print("" if cleaned is None else right_branching(cleaned))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
