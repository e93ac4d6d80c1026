"""Input lines, and the files of one line per input line read beside them (generate's --NAME-file of each decoding
rule, search/rules.py; score-pairs' --target): each file opened and read once, its lines checked as they come
(`text_lines`), a line of each side file read with each input line (`read_beside`, so that pipes stream together
as files do), and each chunk's side lines read as its sentences' rules (`rules_beside`)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nmt_cli.config import GenerateConfig, SearchConfig
from nmt_cli.data import BOM, raw_text_problem
from nmt_cli.errors import DataError
from nmt_cli.search.rules import OPTIONS, SentenceRules, read_rules
from nmt_cli.search.translate import Translator


@dataclass
class SideLines:
    """A line-aligned file's lines, read one with each input line (`read_beside`) and taken a chunk at a time."""

    option: str  # "--prefix-file"
    name: str  # the file
    what: str  # what it gives, as its errors say it
    lines: Iterator[str]
    first_line: int = 1  # the file's line number of its first line
    pending: list[str] = field(default_factory=list)  # read beside input lines, not yet taken
    taken: int = 0

    def take(self, n: int) -> tuple[list[str], list[str]]:
        """The lines of the next n input lines (read beside them), and where each one is (`FILE:LINE`)."""
        assert len(self.pending) >= n, "read_beside reads a line of the file with each input line"
        texts, self.pending = self.pending[:n], self.pending[n:]
        where = [f"{self.name}:{self.first_line + self.taken + j}" for j in range(n)]
        self.taken += n
        return texts, where


def read_beside(
    lines: Iterable[str], sides: Sequence[SideLines], input_name: str, first_line: int = 1
) -> Iterator[str]:
    """`lines`, the input's (`input_name`: "--input FILE"), each read with the next line of every side file, so that
    files fed through pipes advance together; DataError where one file ends before another, at the other's line."""
    number = first_line
    for line in lines:
        for side in sides:
            text = next(side.lines, None)
            if text is None:
                raise DataError(
                    f"{side.option} {side.name} ends before line {number} of {input_name}; give {side.what}"
                )
            side.pending.append(text)
        yield line
        number += 1
    for side in sides:
        if next(side.lines, None) is not None:
            raise DataError(f"{input_name} ends before line {number} of {side.option} {side.name}; give {side.what}")


def input_name(cfg: GenerateConfig) -> str:
    return "stdin" if cfg.input == "-" else str(cfg.input)


def buffer_size_of(cfg: GenerateConfig) -> int:
    """--buffer-size, else 1 line at a time from a terminal (each line translated as it is typed), else 1000."""
    return cfg.buffer_size or (1 if cfg.input == "-" and sys.stdin.isatty() else 1000)


def open_with_side_files(
    cfg: GenerateConfig, stack: ExitStack, num_shards: int, shard_id: int
) -> tuple[Iterator[list[str]], dict[str, SideLines]]:
    """--input's chunks of lines, each line read with its line of every --NAME-file given (each file opened and read
    once), and those files' SideLines by the rule's name; DataError for a sharded input and a side file of other
    line counts (both read whole to take the shard)."""
    raw_lines, first_line, n_lines = open_input(cfg.input, stack, num_shards, shard_id)
    name, files, sides = input_name(cfg), dict(cfg.rule_files), {}
    for rule in (o for o in OPTIONS if o.name in files):
        path = files[rule.name]
        raw_side, first, n_side = open_input(path, stack, num_shards, shard_id)
        if n_side != n_lines:
            raise DataError(
                f"{rule.file_option} {path} has {n_side} lines and --input {name} has {n_lines}; give {rule.line}"
            )
        sides[rule.name] = SideLines(rule.file_option, path, rule.line, text_lines(raw_side, path, first), first)
    lines = read_beside(text_lines(raw_lines, name, first_line), list(sides.values()), f"--input {name}", first_line)
    return in_chunks(lines, buffer_size_of(cfg)), sides


def open_input(
    path: str | None, stack: ExitStack, num_shards: int, shard_id: int
) -> tuple[Iterable[bytes], int, int | None]:
    """The input's raw lines (decoded by text_lines), the line number of the first one, and how many lines the whole
    file has where it was read whole to find this shard's lines, else None (stdin and files stream)."""
    if path == "-":
        return (sys.stdin.buffer if hasattr(sys.stdin, "buffer") else (s.encode() for s in sys.stdin)), 1, None
    assert path is not None
    stream = stack.enter_context(Path(path).open("rb"))  # noqa: SIM115 (the caller's ExitStack closes it)
    if num_shards == 1:
        return stream, 1, None
    lines = stream.readlines()
    shard = shard_range(len(lines), num_shards, shard_id)
    return [lines[i] for i in shard], shard.start + 1, len(lines)


def read_lines(
    stream: Iterable[bytes], buffer_size: int, name: str, first_line: int = 1, pieces: bool = False
) -> Iterator[list[str]]:
    """Chunks of up to `buffer_size` lines of `stream` (text_lines), so that stdin streams."""
    return in_chunks(text_lines(stream, name, first_line, pieces), buffer_size)


def text_lines(stream: Iterable[bytes], name: str, first_line: int = 1, pieces: bool = False) -> Iterator[str]:
    """The lines (newlines stripped), each decoded as strict UTF-8 and checked as it is read, so that a bad byte stops
    the run before anything of its chunk is translated or written: DataError `name:LINE: invalid UTF-8`, or a line
    serve would refuse too (data.raw_text_problem; `pieces`: lines of sentencepiece pieces are wanted)."""
    for number, raw in enumerate(stream, start=first_line):
        try:  # a line as `nmt score` reads one (data.split_lines): "\n" ends it, one "\r" before it is dropped
            text = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{name}:{number}: invalid UTF-8 (byte {e.start} of the line); fix or re-encode the input"
            ) from None
        if problem := raw_text_problem(text, pieces):
            raise DataError(f"{name}:{number}: the line {problem}")
        yield text.removeprefix(BOM) if number == 1 else text


def in_chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """`lines` in lists of `size` (the last one shorter)."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def shard_range(n: int, num_shards: int, shard_id: int) -> range:
    """Contiguous shard `shard_id` of `num_shards` over n items: concatenating shard outputs in id order
    restores the input order."""
    return range(n * shard_id // num_shards, n * (shard_id + 1) // num_shards)


def rules_beside(
    sides: dict[str, SideLines], translator: Translator, sources: Sequence[np.ndarray], search: SearchConfig
) -> tuple[SentenceRules, ...]:
    """The rules of the next input lines (`sources`) from their lines of the side files, by the rule's name
    (search/rules.py's `read_rules`: DataError `FILE:LINE: ...`; none without side files)."""
    if not sides:
        return ()
    values, where = {}, {}
    for rule in (o for o in OPTIONS if o.name in sides):
        texts, where[rule.name] = sides[rule.name].take(len(sources))
        values[rule.name] = [rule.value(text) for text in texts]
    src_lens, max_positions = [len(s) for s in sources], translator.model.max_positions
    return read_rules(
        translator.vocab, values, src_lens=src_lens, search=search, max_positions=max_positions, where=where
    )
