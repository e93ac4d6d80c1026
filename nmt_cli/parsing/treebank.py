"""WSJ sections of a local Penn Treebank copy as one tree per line (and their words), for recipes/wsj_parsing.

    python -m nmt_cli.parsing.treebank TREEBANK_MRG_WSJ FIRST LAST OUT_PREFIX

reads TREEBANK_MRG_WSJ/NN/wsj_NNxx.mrg for sections FIRST..LAST (e.g. 02 21) and writes
OUT_PREFIX.tree (the trees as they are, one per line) and OUT_PREFIX.words (their words without
-NONE- elements). The treebank is licensed (LDC99T42) and never downloaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nmt_cli.errors import DataError
from nmt_cli.parsing.tree import EMPTY_TAG, parse_tree, split_mrg


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
    """Write OUT_PREFIX.tree and .words; returns the number of trees."""
    n = 0
    with (
        open(f"{out_prefix}.tree", "w", encoding="utf-8") as ft,
        open(f"{out_prefix}.words", "w", encoding="utf-8") as fw,
    ):
        for path in section_files(root, first, last):
            for text in split_mrg(path.read_text(encoding="utf-8")):
                tree = parse_tree(text)
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
