"""A request read for one served model: its search fields checked as generate checks its options (search/settings.py)
and against the server's caps (caps.py), and its texts checked and encoded with the checkpoint's sentencepiece
model (a parser's as treebank words), with the decoding rules it asks for (search/rules.py, as generate reads
them). Every error names the request's own field (`beam`, `texts[2]`, `prefix[0]`), and is a 400."""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from nmt_cli.config import SearchConfig
from nmt_cli.data import raw_text_problem
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.parsing.parser import ptb_words
from nmt_cli.search.rules import OPTIONS, SentenceRules, read_rules
from nmt_cli.search.settings import SearchBounds, available_memory, search_batch_size, search_settings
from nmt_cli.serve.caps import Caps, cap_problem, check_outputs, check_text_length, request_terms

SEARCH_TYPES = typing.get_type_hints(SearchConfig)
SEARCH_FIELDS = tuple(f.name for f in fields(SearchConfig))
NOT_SEARCH_FIELDS = tuple(o.name for o in OPTIONS)  # a request's fields beside its texts that set no search setting


@dataclass(frozen=True)
class Sentence:
    """One text of a request, encoded: its pieces (cut to the model's positions) and, for a parser, its words; and
    the rules it is searched by."""

    ids: np.ndarray
    pieces: int  # before the cut
    words: list[str] | None = None
    alignment: str | None = None  # the request's "alignment": "hard" or "soft", or None for none
    rules: SentenceRules = SentenceRules()  # its decoding rules (the request's `prefix`, `constraints`)


@dataclass(frozen=True)
class RequestReader:
    """How a served model reads a request: the settings every request starts from, and what they must fit."""

    path: str  # the served checkpoint, as errors name it
    search: SearchConfig  # the server's search settings
    bounds: SearchBounds  # what a request's search settings must fit (search/settings.py)
    caps: Caps
    vocab: Vocab
    max_positions: int  # an ensemble's: the smallest member's
    is_parser: bool

    @property
    def limit(self) -> int:
        """The longest source the model takes, in pieces (EOS takes a position)."""
        return self.max_positions - 1

    def search_config(self, fields_given: dict[str, Any]) -> SearchConfig:
        """The server's search settings with a request's own; ConfigError or DataError names a field that does not
        fit (in the request's words: `beam`, not generate's `--beam`), or a cap it exceeds."""
        given = {name: value for name, value in fields_given.items() if name not in NOT_SEARCH_FIELDS}
        if not given:  # the server's own settings, checked against the caps and the memory when it started
            return self.search
        overrides = {name: search_field_value(name, value) for name, value in given.items()}
        try:
            if problem := cap_problem(replace(self.search, **overrides), self.caps, flag=False):  # they say the most
                raise DataError(problem)
            return search_settings(self.path, self.search, overrides, self.is_parser, self.bounds)
        except ConfigError as e:
            raise ConfigError(request_terms(str(e))) from None

    def read(
        self, texts: list[str], fields: dict[str, Any], rules: dict[str, list[Any]], names: list[str] | None = None
    ) -> tuple[SearchConfig, list[Sentence]]:
        """A request's search settings (its search fields) and its texts prepared, each to be aligned as its
        `alignment` field asks and to follow its `rules` (by name: body.py's `request_rules`); NmtError names a
        field or text that does not fit (a text by `names`, the request's own field for it: `prepare`)."""
        alignment = fields.pop("alignment", None)
        if alignment not in (None, "hard", "soft"):
            raise DataError(f'"alignment" must be "hard" or "soft", not {alignment!r}')
        if alignment is not None and self.is_parser:
            raise DataError('"alignment": this server parses; alignments are of translations')
        search = self.search_config(fields)
        prepared = self.prepare(texts, search, rules, names)
        return search, [replace(s, alignment=alignment) for s in prepared]

    def prepare(
        self,
        texts: list[str],
        search: SearchConfig | None = None,
        rules: dict[str, list[Any]] | None = None,
        names: list[str] | None = None,
    ) -> list[Sentence]:
        """Encode a request's texts with the checkpoint's sentencepiece model (a parser's as treebank words);
        with the request's `search`, refuse a text whose output may run past --max-output-tokens. `rules`: each
        rule's values, one per text (search/rules.py's `read_rules`). `names`: how errors name each text, the
        request's own field for it (`text`, `q[1] (line 2)`; default `texts[I]`)."""
        names = names or [f"texts[{i}]" for i in range(len(texts))]
        for name, text in zip(names, texts):
            check_text_length(name, text, self.caps)
            check_text(name, text)
        if not self.is_parser:
            sentences = [Sentence(np.asarray(ids, dtype=np.int64), len(ids)) for ids in self.vocab.encode(texts)]
        else:
            words = [ptb_words(text) for text in texts]
            encoded = self.vocab.encode([" ".join(w) for w in words])
            sentences = [Sentence(np.asarray(ids, dtype=np.int64), len(ids), w) for ids, w in zip(encoded, words)]
        if search is not None:
            check_outputs(search, [self.length(s) for s in sentences], self.caps, names)
            longest, have = max((self.length(s) for s in sentences), default=1), available_memory(self.bounds.device)
            try:  # the worker splits a batch down to one sentence: even one of the longest must fit the memory now
                search_batch_size(search, self.bounds, longest, batch_size=0, have=have)
            except ConfigError as e:
                raise ConfigError(request_terms(str(e))) from None
        if not rules:
            return sentences
        search = search or self.search
        for option in (o for o in OPTIONS if o.name in rules):
            if problem := option.problem(search, self.path if self.is_parser else None):
                raise DataError(f"{option.name} {problem}")
        src_lens = [s.pieces for s in sentences]
        read = read_rules(self.vocab, rules, src_lens=src_lens, search=search, max_positions=self.max_positions)
        return [replace(sentence, rules=r) for sentence, r in zip(sentences, read)]

    def length(self, sentence: Sentence) -> int:
        """The pieces the search sees (a parser's sentence without words is not searched)."""
        if sentence.words is not None and not sentence.words:
            return 0
        return min(sentence.pieces, self.limit)

    def warning(self, sentence: Sentence) -> str | None:
        if sentence.pieces <= self.limit:
            return None
        return (
            f"the text has {sentence.pieces} pieces, more than the model's {self.limit} positions; "
            f"it was truncated to {self.limit}"
        )


def search_field_value(name: str, value: Any) -> Any:
    """A request's search field, which must be one of SearchConfig's, of its type (JSON's true is no number)."""
    if name not in SEARCH_TYPES:
        raise DataError(f"unknown field {name!r}; the search fields are {', '.join(SEARCH_FIELDS)}")
    want = SEARCH_TYPES[name]
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[want]
    if not ok:
        raise DataError(f"{name!r} must be {'a number' if want is float else want.__name__}, not {value!r}")
    return float(value) if want is float else value


def check_text(name: str, text: str) -> None:
    """A text is one line of raw text, as a line of generate's --input (data.raw_text_problem); `name`: the
    request's field for it."""
    if "\n" in text or "\r" in text:
        raise DataError(f"{name}: the text holds a line break; send one sentence per text")
    if problem := raw_text_problem(text):
        raise DataError(f"{name}: the text {problem}")
