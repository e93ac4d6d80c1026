"""A request's decoding rules beyond its search settings, built here once for generate (each --NAME-file), serve
(each NAME field) and the Python API: the per-sentence options (`OPTIONS`), each source's values encoded and checked
to fit its output (`read_rules`: one `SentenceRules` per source), and a call's rules composed into what the search
follows (`rules_source`, with --no-repeat-ngram-size's ban). A new option is its rule (a module of search/, as
prefix.py), its entry here (OPTIONS, a field of SentenceRules, a line each in `read_rules` and `rules_source`), its
test and the guide. The search's modules are imported where used: generate's --help reads OPTIONS without torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nmt_cli.config import SearchConfig
from nmt_cli.data import raw_text_problem
from nmt_cli.errors import DataError

if TYPE_CHECKING:
    from nmt_cli.data.vocab import Vocab
    from nmt_cli.search.constraint import ConstraintSource


@dataclass(frozen=True)
class RuleOption:
    """A per-sentence decoding option: serve's request field `name` (a value per text) and generate's
    --NAME-file (a line per input line)."""

    name: str
    noun: str  # what one value is called in errors
    what: str  # what the values do, for generate's --help and serve's /openapi.json
    line: str  # what a line of --NAME-file gives
    phrases: bool  # a value is a list of phrases (a line of --NAME-file: tab-separated), else one text
    sampling: bool  # sampling follows it too (else beam search alone, greedy --beam 1 included)

    @property
    def file_option(self) -> str:
        return f"--{self.name}-file"

    @property
    def help(self) -> str:
        return f"{self.what[:1].upper()}{self.what[1:]}; with --input, {self.line}."

    def value(self, line: str) -> str | list[str]:
        """A line of --NAME-file as the option's value."""
        return (line.split("\t") if line else []) if self.phrases else line

    def problem(self, search: SearchConfig, parser: str | None) -> str | None:
        """Why a search cannot follow the option, said after its name, or None: a parsing checkpoint's (`parser`,
        its path), or sampling where the option needs beam search."""
        if parser is not None:
            return f"cannot apply: {parser} is a parsing model, whose trees follow their words; drop it"
        if search.sampling and not self.sampling:
            return f"needs beam search; sampling cannot take {self.noun}s"
        return None


OPTIONS = (
    RuleOption(
        "prefix",
        "prefix",
        "target prefixes: each translation begins with its text (whole words), forced and scored",
        "one prefix line (an empty one for none) per input line",
        phrases=False,
        sampling=True,
    ),
    RuleOption(
        "constraints",
        "constraint",
        "target phrases every translation contains (lexically constrained beam search)",
        "one line of tab-separated constraints (an empty one for none) per input line",
        phrases=True,
        sampling=False,
    ),
)


@dataclass(frozen=True)
class SentenceRules:
    """One source's decoding rules (`read_rules`): the pieces its output begins with (search/prefix.py) and the
    target phrases, as pieces, that it contains (search/lexical.py)."""

    prefix: tuple[int, ...] = ()
    phrases: tuple[tuple[int, ...], ...] = ()


def read_rules(
    vocab: Vocab,
    values: Mapping[str, Sequence[Any]],
    *,
    src_lens: Sequence[int],
    search: SearchConfig,
    max_positions: int,
    where: Mapping[str, Sequence[str]] | None = None,
) -> tuple[SentenceRules, ...]:
    """Each source's rules from the options' values (by OPTIONS' names; one per source of src_lens[i] pieces, in
    order: a text, or a list of phrases), encoded and checked to fit its output, alone and together.

    Raises:
        DataError: naming where[name][i] (default `name[i]`: `prefix[0]`) and what to change, or a count of values
            other than the sources'.
    """
    from nmt_cli.search.lexical import check_with_prefixes, checked_phrases
    from nmt_cli.search.prefix import checked_prefixes

    n = len(src_lens)
    named = {name: list((where or {}).get(name) or [f"{name}[{i}]" for i in range(n)]) for name in values}
    for option in OPTIONS:
        for i, value in enumerate(values.get(option.name, ())):
            if option.phrases and isinstance(value, str):
                raise TypeError(f"{named[option.name][i]} is a string; give a list of phrases ([] for none)")
            check_texts(named[option.name][i], option.noun, value if option.phrases else [value])
    if short := next((name for name, given in values.items() if len(given) != n), None):
        raise DataError(f"{len(values[short])} values of {short} for {n} sources; give one per source")
    prefixes: list[Any] = [()] * n
    phrases: list[Any] = [()] * n
    if "constraints" in values:
        phrases = checked_phrases(vocab, values["constraints"], src_lens, search, max_positions, named["constraints"])
    if "prefix" in values:
        prefixes = checked_prefixes(vocab, values["prefix"], src_lens, search, max_positions, named["prefix"])
        check_with_prefixes(phrases, prefixes, src_lens, search, max_positions, named["prefix"])
    return tuple(SentenceRules(tuple(map(int, p)), tuple(map(tuple, ph))) for p, ph in zip(prefixes, phrases))


def check_texts(name: str, noun: str, texts: Sequence[str]) -> None:
    """A value's texts are each one line of raw text, as a line of generate's --input (data.raw_text_problem)."""
    for text in texts:
        if "\n" in text or "\r" in text:
            raise DataError(f"{name}: the {noun} holds a line break; give one line per text")
        if problem := raw_text_problem(text):
            raise DataError(f"{name}: the {noun} {problem}")


def rules_source(rules: Sequence[SentenceRules], search: SearchConfig) -> ConstraintSource | None:
    """What a search of these sources' rules (one per source, or none) follows, with --no-repeat-ngram-size's ban:
    None where it follows nothing."""
    from nmt_cli.search.constraint import all_of
    from nmt_cli.search.lexical import LexicalConstraints
    from nmt_cli.search.ngram import no_repeat_ngrams
    from nmt_cli.search.prefix import prefix_source

    lexical = LexicalConstraints([r.phrases for r in rules]) if any(r.phrases for r in rules) else None
    return all_of(lexical, prefix_source([r.prefix for r in rules]), no_repeat_ngrams(search))
