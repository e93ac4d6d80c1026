"""`nmt generate` with a parsing checkpoint (section 6.3): the options a parser refuses, and raw sentences parsed
one buffer at a time into one bracketed tree per line (parsing/parser.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TextIO

from nmt_cli.config import GenerateConfig, SearchConfig
from nmt_cli.errors import ConfigError
from nmt_cli.parsing.parser import ParseNotes, TreeParser, ptb_words
from nmt_cli.search.translate import Summary, Translator, sampling_generator

logger = logging.getLogger(__name__)


def check_parse_request(cfg: GenerateConfig) -> None:
    """A parser reads sentences (--input) and writes trees (plain output), so refuse anything else."""
    if cfg.input is None:
        raise ConfigError(
            f"{cfg.path} is a parsing model: give the sentences with --input FILE|- "
            "(one tokenised sentence per line), not a DATA_DIR"
        )
    if cfg.output_format not in (None, "plain"):
        raise ConfigError(
            f"{cfg.path} is a parsing model; it writes one tree per line "
            f"(--output-format plain), not {cfg.output_format}"
        )


def generate_trees(
    translator: Translator,
    chunks: Iterable[list[str]],
    *,
    search: SearchConfig,
    max_tokens: int,
    batch_size: Callable[[int], int],
    out: TextIO,
    leaves: str | None = "pos",
    source: tuple[str, int] = ("input", 1),
) -> Summary:
    """Parse raw sentences one buffer (chunk of lines) at a time; one tree (or an empty line) per input line. leaves:
    the checkpoint's --tree-leaves; source: the input's name and first line number, for the warnings; batch_size:
    as generate's (settings.search_batch_size)."""
    parser = TreeParser.of(translator, leaves)
    generator = sampling_generator(search, translator.device)  # one for every chunk
    summary, notes, n_empty = Summary(), ParseNotes(), 0
    for chunk in chunks:
        start = time.perf_counter()
        words = [ptb_words(line) for line in chunk]
        most = max((2 * len(" ".join(w)) + 1 for w in words), default=0)  # pieces at most: a mark and a character each
        trees, found = parser.parse(words, search, max_tokens, batch_size(most), generator)
        notes.add(found, source[1] + summary.n_sentences)
        n_empty += sum(t is None for t in trees)
        summary.n_sentences += len(chunk)
        summary.n_tokens += sum(len(w) for w in words)
        summary.seconds += time.perf_counter() - start
        for tree in trees:
            print("" if tree is None else str(tree), file=out)
        out.flush()
    if n_empty:
        logger.warning("%d empty input line(s) gave empty output lines", n_empty)
    notes.warn(source[0])
    return summary
