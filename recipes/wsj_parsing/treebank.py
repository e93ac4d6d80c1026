"""WSJ sections of a local Penn Treebank copy as one tree per line (and their words), for recipes/wsj_parsing.

    python recipes/wsj_parsing/treebank.py TREEBANK_MRG_WSJ FIRST LAST OUT_PREFIX

reads TREEBANK_MRG_WSJ/NN/wsj_NNxx.mrg for sections FIRST..LAST (e.g. 02 21) and writes
OUT_PREFIX.tree (the trees as they are, one per line) and OUT_PREFIX.words (their words without
-NONE- elements). The treebank is licensed (LDC99T42) and never downloaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nmt_cli.errors import DataError
from nmt_cli.files import atomic_text_output
from nmt_cli.parsing.tree import EMPTY_TAG, TOKEN, TreeSyntaxError, parse_tree


def split_mrg(text: str) -> list[str]:
    """The trees of a treebank .mrg file (one tree over several lines each), one string per tree."""
    trees, depth, current = [], 0, []
    for tok in TOKEN.findall(text):
        current.append(tok)
        depth += (tok == "(") - (tok == ")")
        if depth == 0:
            trees.append(" ".join(current).replace("( ", "(").replace(" )", ")"))
            current = []
    if current:
        raise DataError("a tree in the .mrg text is not closed")
    return trees


def section_files(root: Path, first: int, last: int) -> list[Path]:
    files = []
    for section in range(first, last + 1):
        found = sorted((root / f"{section:02d}").glob("wsj_*.mrg"))
        if not found:
            raise DataError(
                f"no wsj_*.mrg files in {root / f'{section:02d}'}; give the treebank's parsed/mrg/wsj directory"
            )
        files += found
    return files


def convert(root: Path, first: int, last: int, out_prefix: Path) -> int:
    """Write OUT_PREFIX.tree and .words; returns the number of trees.

    Both are written whole or not at all (the .tree file, which the recipe tests for, renamed last): a
    conversion that fails or is killed half-way leaves no part of a split that the next run could take for
    the whole split.
    """
    n = 0
    with (
        atomic_text_output(Path(f"{out_prefix}.tree"), "tree file") as ft,
        atomic_text_output(Path(f"{out_prefix}.words"), "words file") as fw,
    ):
        for path in section_files(root, first, last):
            try:
                trees = [(text, parse_tree(text)) for text in split_mrg(path.read_text(encoding="utf-8"))]
            except (DataError, TreeSyntaxError, UnicodeDecodeError) as e:
                raise DataError(f"{path}: {e}") from None
            for text, tree in trees:
                ft.write(text + "\n")
                fw.write(" ".join(p.word or "" for p in tree.preterminals() if p.label != EMPTY_TAG) + "\n")
                n += 1
    return n


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        n = convert(Path(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3]))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{n} trees -> {argv[3]}.tree, {argv[3]}.words", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
