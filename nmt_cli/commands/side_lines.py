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
from nmt_cli.search.constraint import ConstraintSource, all_of
from nmt_cli.search.lexical import LexicalConstraints, check_with_prefixes, checked_phrases
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
            DataError: the file ends first, or goes on where the input has ended.
        """
        chunk = next(self.chunks, None)
        if chunk is None or len(chunk) < n:
            raise self.mismatch("ends before")
        if len(chunk) > n:  # the input's last chunk, shorter than the file's
            raise self.mismatch("has more lines than")
        where = [f"{self.name}:{self.first_line + self.read + j}" for j in range(n)]
        self.read += n
        return chunk, where

    def check_end(self) -> None:
        """Raises DataError where the file has lines left once the input has ended."""
        if next(self.chunks, None) is not None:
            raise self.mismatch("has more lines than")


def rules_for(
    constraints: SideLines | None,
    prefixes: SideLines | None,
    translator: Translator,
    sources: Sequence[np.ndarray],
    search: SearchConfig,
) -> ConstraintSource | None:
    """What the next input lines' (`sources`) searches follow: their lexical constraints (tab-separated target
    phrases) and prefixes, each checked against its source, and both together (check_with_prefixes); None where
    neither file is given.

    Raises:
        DataError: a file ends first, a phrase is empty, or a line's rules cannot fit its output (`FILE:LINE: ...`).
    """
    src_lens, max_positions = [len(s) for s in sources], translator.model.max_positions
    phrases, encoded = None, None
    if constraints is not None:
        texts, where = constraints.next_lines(len(sources))
        phrase_lists = [text.split("\t") if text else [] for text in texts]
        phrases = checked_phrases(translator.vocab, phrase_lists, src_lens, search, max_positions, where)
    if prefixes is not None:
        texts, where = prefixes.next_lines(len(sources))
        encoded = checked_prefixes(translator.vocab, texts, src_lens, search, max_positions, where)
    if phrases is not None and encoded is not None:
        check_with_prefixes(phrases, encoded, src_lens, search, max_positions, where)  # named by the prefix's line
    return all_of(None if phrases is None else LexicalConstraints(phrases), prefix_source(encoded or []))


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)
