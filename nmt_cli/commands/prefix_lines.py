"""`nmt generate --prefix-file`: the target prefixes read beside --input, one line per input line, checked as the
input's lines are, and handed to the search as a ConstraintSource (search/prefix.py) chunk by chunk."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt_cli.config import GenerateConfig, SearchConfig
from nmt_cli.errors import DataError
from nmt_cli.search.constraint import ConstraintSource
from nmt_cli.search.prefix import encode_prefixes, prefix_problem, prefix_source
from nmt_cli.search.translate import Translator


@dataclass
class PrefixLines:
    """--prefix-file's lines in the chunks --input is read in (generate's read_lines, of the same size)."""

    chunks: Iterator[list[str]]
    name: str  # the prefix file
    input_name: str
    first_line: int

    @classmethod
    def of(cls, cfg: GenerateConfig, input_name: str, chunks: Iterator[list[str]], first_line: int) -> PrefixLines:
        """The prefix file's chunks; a file input of another number of lines is refused before anything is
        translated (stdin is checked as it streams)."""
        assert cfg.prefix_file is not None
        if cfg.input != "-":
            n_input, n_prefix = count_lines(Path(str(cfg.input))), count_lines(Path(cfg.prefix_file))
            if n_input != n_prefix:
                raise DataError(
                    f"--prefix-file {cfg.prefix_file} has {n_prefix} lines and --input {cfg.input} has {n_input}; "
                    "give one prefix line (an empty one for none) per input line"
                )
        return cls(chunks, cfg.prefix_file, input_name, first_line)

    def mismatch(self, how: str) -> DataError:
        return DataError(
            f"--prefix-file {self.name} {how} --input {self.input_name}; give one prefix line (an empty one for "
            "none) per input line"
        )

    def next_source(
        self, translator: Translator, sources: list[np.ndarray], search: SearchConfig, first_id: int
    ) -> ConstraintSource | None:
        """The prefixes of the next chunk of input lines (`sources`, the first of them the chunk's `first_id`-th).

        Raises:
            DataError: the prefix file ends first, or a prefix cannot begin its line's output (`FILE:LINE: ...`).
        """
        chunk = next(self.chunks, None)
        if chunk is None or len(chunk) != len(sources):
            raise self.mismatch("ends before")
        prefixes = encode_prefixes(translator.vocab, chunk)
        for j, (prefix, source) in enumerate(zip(prefixes, sources)):
            if problem := prefix_problem(prefix, len(source), search, translator.model.max_positions):
                raise DataError(f"{self.name}:{self.first_line + first_id + j}: the prefix {problem}")
        return prefix_source(prefixes)

    def check_end(self) -> None:
        """Raises DataError where the prefix file has lines left once the input has ended."""
        if next(self.chunks, None) is not None:
            raise self.mismatch("has more lines than")


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)
