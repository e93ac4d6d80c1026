"""Files of one line per --input line read beside it (`nmt generate --prefix-file`, `--constraints-file`): read in
the input's chunks, their line counts checked before anything is translated where the input is a file (stdin's as
it streams), and each chunk turned into what the search follows (search/prefix.py, search/lexical.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nmt_cli.config import SearchConfig
from nmt_cli.errors import DataError
from nmt_cli.search.constraint import ConstraintSource
from nmt_cli.search.lexical import LexicalConstraints, checked_phrases
from nmt_cli.search.prefix import checked_prefixes, prefix_source
from nmt_cli.search.translate import Translator

# What each file gives for one input line, as its errors say it.
PREFIX_LINE = "one prefix line (an empty one for none)"
CONSTRAINT_LINE = "one line of tab-separated constraints (an empty one for none)"


@dataclass
class SideLines:
    """A line-aligned file's lines in the chunks --input is read in (generate's read_lines, of the same size)."""

    option: str  # "--prefix-file"
    name: str  # the file
    what: str  # what one line holds (PREFIX_LINE, CONSTRAINT_LINE)
    input_name: str
    chunks: Iterator[list[str]]
    first_line: int  # the file's line number of the next chunk's first line
    read: int = field(default=0)  # lines handed out so far

    @classmethod
    def of(
        cls, option: str, path: str, what: str, input_path: str, chunks: Iterator[list[str]], first_line: int
    ) -> SideLines:
        """The file's chunks; a file input of another number of lines is refused before anything is translated
        (stdin is checked as it streams)."""
        input_name = "stdin" if input_path == "-" else input_path
        if input_path != "-":
            n_input, n_side = count_lines(Path(input_path)), count_lines(Path(path))
            if n_input != n_side:
                raise DataError(
                    f"{option} {path} has {n_side} lines and --input {input_path} has {n_input}; give {what} per "
                    "input line"
                )
        return cls(option, path, what, input_name, chunks, first_line)

    def mismatch(self, how: str) -> DataError:
        return DataError(f"{self.option} {self.name} {how} --input {self.input_name}; give {self.what} per input line")

    def next_lines(self, n: int) -> tuple[list[str], list[str]]:
        """The lines of the next n input lines, and where each one is (`FILE:LINE`).

        Raises:
            DataError: the file ends first.
        """
        chunk = next(self.chunks, None)
        if chunk is None or len(chunk) != n:
            raise self.mismatch("ends before")
        where = [f"{self.name}:{self.first_line + self.read + j}" for j in range(n)]
        self.read += n
        return chunk, where

    def check_end(self) -> None:
        """Raises DataError where the file has lines left once the input has ended."""
        if next(self.chunks, None) is not None:
            raise self.mismatch("has more lines than")


def prefixes_for(
    lines: SideLines, translator: Translator, sources: Sequence[np.ndarray], search: SearchConfig
) -> ConstraintSource | None:
    """The prefixes of the next input lines (`sources`), or None where all are empty.

    Raises:
        DataError: the file ends first, or a prefix cannot begin its line's output (`FILE:LINE: ...`).
    """
    texts, where = lines.next_lines(len(sources))
    src_lens = [len(s) for s in sources]
    return prefix_source(
        checked_prefixes(translator.vocab, texts, src_lens, search, translator.model.max_positions, where)
    )


def constraints_for(
    lines: SideLines, translator: Translator, sources: Sequence[np.ndarray], search: SearchConfig
) -> LexicalConstraints:
    """The lexical constraints (tab-separated target phrases) of the next input lines (`sources`), encoded and
    checked against their sources (checked_phrases).

    Raises:
        DataError: the file ends first, a phrase is empty, or the phrases cannot fit their output (`FILE:LINE: ...`).
    """
    texts, where = lines.next_lines(len(sources))
    phrase_lists = [text.split("\t") if text else [] for text in texts]
    src_lens, max_positions = [len(s) for s in sources], translator.model.max_positions
    return LexicalConstraints(checked_phrases(translator.vocab, phrase_lists, src_lens, search, max_positions, where))


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)
