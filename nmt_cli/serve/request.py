"""A request read for one served model: its search fields checked as generate checks its options (search/settings.py)
and against the server's caps (caps.py), and its texts checked and encoded with the checkpoint's sentencepiece
model (a parser's as treebank words), with the decoding rules it asks for (rules.py). Every error names the
request's own field (`beam`, `texts[2]`, `prefix[0]`), and is a 400."""

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
from nmt_cli.search.settings import SearchBounds, search_settings
from nmt_cli.serve.caps import Caps, check_outputs, check_request, check_text_length, request_terms
from nmt_cli.serve.rules import Sentence, sentence_rules

SEARCH_TYPES = typing.get_type_hints(SearchConfig)
SEARCH_FIELDS = tuple(f.name for f in fields(SearchConfig))
# a request's fields beside its texts that set no search setting (rules.py's)
NOT_SEARCH_FIELDS = ("prefix", "constraints")


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
            check_request(replace(self.search, **overrides), self.caps)  # the caps first: they say the most
            return search_settings(self.path, self.search, overrides, self.is_parser, self.bounds)
        except ConfigError as e:
            raise ConfigError(request_terms(str(e))) from None

    def read(
        self,
        texts: list[str],
        fields: dict[str, Any],
        constraints: list[list[str]] | None = None,
        prefixes: list[str] | None = None,
        names: list[str] | None = None,
    ) -> tuple[SearchConfig, list[Sentence]]:
        """A request's search settings (its search fields) and its texts prepared, each to be aligned as its
        `alignment` field asks, to contain its `constraints` and to begin with its `prefix`; NmtError names a field
        or text that does not fit (a text by `names`, the request's own field for it: `prepare`)."""
        alignment = fields.pop("alignment", None)
        if alignment not in (None, "hard", "soft"):
            raise DataError(f'"alignment" must be "hard" or "soft", not {alignment!r}')
        if alignment is not None and self.is_parser:
            raise DataError('"alignment": this server parses; alignments are of translations')
        search = self.search_config(fields)
        prepared = self.prepare(texts, search, constraints, prefixes, names)
        return search, [replace(s, alignment=alignment) for s in prepared]

    def prepare(
        self,
        texts: list[str],
        search: SearchConfig | None = None,
        constraints: list[list[str]] | None = None,
        prefixes: list[str] | None = None,
        names: list[str] | None = None,
    ) -> list[Sentence]:
        """Encode a request's texts with the checkpoint's sentencepiece model (a parser's as treebank words);
        with the request's `search`, refuse a text whose output may run past --max-output-tokens. `constraints`:
        each text's target phrases (`request_constraints`), which its output must contain; `prefixes`: one per
        text ("" for none), which its output begins with (`request_prefixes`). `names`: how errors name each text,
        the request's own field for it (`text`, `q[1] (line 2)`; default `texts[I]`)."""
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
        if self.is_parser and constraints is not None:
            raise DataError("constraints: this server runs a parsing model; its trees take no constraints")
        if self.is_parser and prefixes is not None:
            raise DataError(f"prefix: {self.path} is a parsing model; a tree follows its sentence's words")
        search = search or self.search
        return sentence_rules(
            sentences, search, self.vocab, self.max_positions, constraints=constraints, prefixes=prefixes
        )

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
