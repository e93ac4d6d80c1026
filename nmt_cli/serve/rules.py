"""A request's decoding rules, assembled here alone: its `constraints` (target phrases each translation contains,
search/lexical.py) and `prefix` (what each translation begins with, search/prefix.py), checked and encoded with its
texts (`sentence_rules`, as generate's --constraints-file and --prefix-file are read: commands/side_lines.py), and
composed for a batch's search (`decoding_rules`; the search adds `no_repeat_ngram_size`'s ban, search/ngram.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from nmt_cli.config import SearchConfig
from nmt_cli.data import raw_text_problem
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import DataError
from nmt_cli.search.constraint import ConstraintSource, all_of
from nmt_cli.search.lexical import LexicalConstraints, check_search, check_with_prefixes, checked_phrases
from nmt_cli.search.prefix import checked_prefixes, prefix_source


@dataclass(frozen=True)
class Sentence:
    """One text of a request, encoded: its pieces (cut to the model's positions) and, for a parser, its words; and
    the rules it is searched by."""

    ids: np.ndarray
    pieces: int  # before the cut
    words: list[str] | None = None
    alignment: str | None = None  # the request's "alignment": "hard" or "soft", or None for none
    phrases: tuple[tuple[int, ...], ...] = ()  # the request's `constraints` for it, encoded (search/lexical.py)
    prefix: np.ndarray | None = None  # the pieces its translation begins with (the request's `prefix`)


def sentence_rules(
    sentences: list[Sentence],
    search: SearchConfig,
    vocab: Vocab,
    max_positions: int,
    *,
    constraints: list[list[str]] | None,
    prefixes: list[str] | None,
) -> list[Sentence]:
    """The sentences of a request searched with `search`, with their `constraints` (each text's target phrases,
    body.py's `request_constraints`) and `prefixes` (one per text, "" for none: `request_prefixes`) encoded; each
    fits its output, and both together too. DataError or ConfigError names `constraints[i]` or `prefix[i]`."""
    src_lens = [min(s.pieces, max_positions - 1) for s in sentences]  # the pieces the search sees
    if constraints is not None:
        check_search(search, "constraints")
        where = [f"constraints[{i}]" for i in range(len(sentences))]
        phrases = checked_phrases(vocab, constraints, src_lens, search, max_positions, where)
        sentences = [replace(s, phrases=tuple(tuple(p) for p in ph)) for s, ph in zip(sentences, phrases)]
    if prefixes is not None:
        for i, text in enumerate(prefixes):
            if "\n" in text or "\r" in text:
                raise DataError(f"prefix[{i}]: the prefix holds a line break; give one line per text")
            if problem := raw_text_problem(text):
                raise DataError(f"prefix[{i}]: the prefix {problem}")
        where = [f"prefix[{i}]" for i in range(len(prefixes))]
        encoded = checked_prefixes(vocab, prefixes, [s.pieces for s in sentences], search, max_positions, where)
        sentences = [replace(sentence, prefix=ids) for sentence, ids in zip(sentences, encoded)]
    if constraints is not None and prefixes is not None:  # each fits its output; both together too
        forced = [() if s.prefix is None else s.prefix for s in sentences]
        where = [f"prefix[{i}]" for i in range(len(sentences))]
        check_with_prefixes([s.phrases for s in sentences], forced, src_lens, search, max_positions, where)
    return sentences


def decoding_rules(sentences: Sequence[Sentence]) -> ConstraintSource | None:
    """What a batch's search follows: its sentences' lexical constraints and prefixes, composed (None: none)."""
    lexical = LexicalConstraints([s.phrases for s in sentences]) if any(s.phrases for s in sentences) else None
    forced = prefix_source([np.zeros(0, np.int64) if s.prefix is None else s.prefix for s in sentences])
    return all_of(lexical, forced)
