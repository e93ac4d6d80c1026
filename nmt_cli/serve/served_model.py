"""What `nmt serve` translates with: the checkpoint loaded as `nmt generate` loads it, requests' texts
checked and encoded, their search settings checked as generate checks its options, and a batch of
sentences searched with generate's own driver (search/translate.py, or parsing's for a parser), and aligned to
their sources after the search where a request asks (`"alignment": "hard"` or `"soft"`, search/forced.py).

A batch handed to `translate_steps` fits its token budget, so it runs as one batch: a request's sentences get
what generate writes for the same sentences batched the same way. `run` is that search one decoder step per
resumption, so that the batcher's worker can interleave two batches; a parser's batch runs whole in its first.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from nmt_cli import __version__
from nmt_cli.checkpoint import SavedModel
from nmt_cli.config import SearchConfig, ServeConfig
from nmt_cli.data import raw_text_problem
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.parsing.parser import TreeParser, ptb_words
from nmt_cli.search.beam import StillWanted
from nmt_cli.search.constraint import all_of
from nmt_cli.search.forced import add_alignments, alignment_layer
from nmt_cli.search.hypothesis import NOTHING_FOUND, Hypothesis, hypothesis_record
from nmt_cli.search.lexical import LexicalConstraints, check_search, check_with_prefixes, checked_phrases
from nmt_cli.search.prefix import checked_prefixes, prefix_source
from nmt_cli.search.settings import search_settings
from nmt_cli.search.slots import slot_search_for
from nmt_cli.search.translate import Inference, Translator, open_for_inference, sampling_generator, translate_steps
from nmt_cli.serve.caps import (
    Caps,
    check_outputs,
    check_request,
    check_server,
    check_text_length,
    longest_output,
    request_terms,
)
from nmt_cli.serve.queued import Answer
from nmt_cli.steps import Steps, run_to_end

logger = logging.getLogger(__name__)

SEARCH_TYPES = typing.get_type_hints(SearchConfig)
SEARCH_FIELDS = tuple(f.name for f in fields(SearchConfig))
# a request's fields beside its texts that set no search setting (`prepare`'s)
NOT_SEARCH_FIELDS = ("prefix", "constraints")


@dataclass(frozen=True)
class Sentence:
    """One text of a request, encoded: its pieces (cut to the model's positions) and, for a parser, its words."""

    ids: np.ndarray
    pieces: int  # before the cut
    words: list[str] | None = None
    alignment: str | None = None  # the request's "alignment": "hard" or "soft", or None for none
    phrases: tuple[tuple[int, ...], ...] = ()  # the request's `constraints` for it, encoded (search/lexical.py)
    prefix: np.ndarray | None = None  # the pieces its translation begins with (the request's `prefix`)


class ServedModel:
    """A loaded checkpoint and the settings every request starts from."""

    def __init__(self, cfg: ServeConfig, search_overrides: dict[str, Any]) -> None:
        self.path = cfg.path
        self.inference = open_for_inference(cfg, search_overrides)  # the checkpoint read as generate reads it
        saved = self.inference.saved
        self.device, self.precision = self.inference.device, self.inference.precision
        self.is_parser = saved.is_parser
        self.search = self.inference.search
        self.vocab = saved.vocab
        # The model is built (and packed for the CPU) in the worker thread, by warm_up: intra-op thread pools are
        # per thread, and when the main thread's pool packs the model, the worker's own pool competes with it
        # for the cores and searches far slower (benchmarks/bench_serve.py measures the server).
        self._translator: Translator | None = None
        self.parser: TreeParser | None = None
        self.leaves = saved.tree_leaves
        self.max_positions = self.inference.max_positions  # an ensemble's: the smallest member's
        self.max_tokens = cfg.max_batch_tokens
        self.threads = torch.get_num_threads()  # as set_threads left it in the main thread
        self.limit = self.max_positions - 1
        layers = min(m.config.decoder_layers for m in self.inference.members)  # an ensemble's: every member's
        self.alignment_layer = alignment_layer(None, layers)  # generate's default
        self.caps = Caps.of(cfg, self.search, self.max_positions)
        check_server(self.search, self.caps)
        # Answer a sentence as its beam search finishes it, on a GPU: the event loop answers and reads the clients
        # on host cores the search leaves free. On the CPU the search's threads take every core, and the clients
        # handled beside its steps slowed it more than their early return gained (benchmarks/record/serve.md).
        self.slots = slot_search_for(cfg.fixed_slots, cfg.cuda_graphs, self.device)  # as generate's --fixed-slots
        self.answers_early = self.device.type == "cuda"
        self.info = self._info(saved, cfg)

    def _info(self, saved: SavedModel, cfg: ServeConfig) -> dict[str, Any]:
        return {
            "source_lang": saved.source_lang,
            "target_lang": saved.target_lang,
            "task": "parsing" if self.is_parser else "translation",
            "checkpoint": ":".join(str(m.path.resolve()) for m in self.inference.members),
            **updates_of(saved),
            **ensemble_of(self.inference),
            "model": asdict(saved.config),
            "vocab_size": self.vocab.n_pieces,
            "max_positions": self.max_positions,
            "search": asdict(self.search),
            "device": str(self.device),
            "precision": self.precision,
            "quantize": cfg.quantize,
            "fixed_slots": self.slots is not None,
            "cuda_graphs": self.slots is not None and self.slots.graphs is not None,
            "max_batch_tokens": cfg.max_batch_tokens,
            "max_wait_ms": cfg.max_wait_ms,
            "max_request_sentences": cfg.max_request_sentences,
            "max_beam": self.caps.max_beam,
            "max_nbest": self.caps.max_nbest,
            "max_output_tokens": self.caps.max_output_tokens,
            "max_input_chars": self.caps.max_input_chars,
            "nmt_version": __version__,
        }

    def search_config(self, fields_given: dict[str, Any]) -> SearchConfig:
        """The server's search settings with a request's own; ConfigError or DataError names a field that does not
        fit (in the request's words: `beam`, not generate's `--beam`), or a cap it exceeds."""
        given = {name: value for name, value in fields_given.items() if name not in NOT_SEARCH_FIELDS}
        if not given:  # the server's own settings, checked against the caps and the memory when it started
            return self.search
        overrides = {name: search_field_value(name, value) for name, value in given.items()}
        try:
            check_request(replace(self.search, **overrides), self.caps)  # the caps first: they say the most
            return search_settings(self.path, self.search, overrides, self.is_parser, self.inference.bounds)
        except ConfigError as e:
            raise ConfigError(request_terms(str(e))) from None

    def read_request(
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
        if constraints is not None:
            sentences = self.with_phrases(sentences, constraints, search or self.search)
        if prefixes is not None:
            sentences = self.with_prefixes(sentences, prefixes, search or self.search)
        if constraints is not None and prefixes is not None:  # each fits its output; both together too
            check_with_prefixes(
                [s.phrases for s in sentences],
                [() if s.prefix is None else s.prefix for s in sentences],
                [self.length(s) for s in sentences],
                search or self.search,
                self.max_positions,
                [f"prefix[{i}]" for i in range(len(sentences))],
            )
        return sentences

    def with_phrases(
        self, sentences: list[Sentence], constraints: list[list[str]], search: SearchConfig
    ) -> list[Sentence]:
        """The sentences with their constraints encoded; DataError or ConfigError naming `constraints[i]`."""
        if self.is_parser:
            raise DataError("constraints: this server runs a parsing model; its trees take no constraints")
        check_search(search, "constraints")
        where = [f"constraints[{i}]" for i in range(len(sentences))]
        src_lens = [self.length(s) for s in sentences]
        phrases = checked_phrases(self.vocab, constraints, src_lens, search, self.max_positions, where)
        return [replace(s, phrases=tuple(tuple(p) for p in ph)) for s, ph in zip(sentences, phrases)]

    def with_prefixes(self, sentences: list[Sentence], prefixes: list[str], search: SearchConfig) -> list[Sentence]:
        """The sentences with their prefixes encoded; DataError names a prefix that cannot begin its output."""
        if self.is_parser:
            raise DataError(f"prefix: {self.path} is a parsing model; a tree follows its sentence's words")
        for i, text in enumerate(prefixes):
            if "\n" in text or "\r" in text:
                raise DataError(f"prefix[{i}]: the prefix holds a line break; give one line per text")
            if problem := raw_text_problem(text):
                raise DataError(f"prefix[{i}]: the prefix {problem}")
        where = [f"prefix[{i}]" for i in range(len(prefixes))]
        src_lens = [s.pieces for s in sentences]
        encoded = checked_prefixes(self.vocab, prefixes, src_lens, search, self.max_positions, where)
        return [replace(sentence, prefix=ids) for sentence, ids in zip(sentences, encoded)]

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

    @contextmanager
    def worker_context(self) -> Iterator[None]:
        """The worker thread's settings: its own intra-op threads (they are per thread) and inference mode. The
        worker is the one thread that runs PyTorch: an OpenMP team of the main thread's, alive beside the worker's,
        would slow every parallel op of the worker about 3x on the CPU (tests/serve/test_one_openmp_team.py)."""
        torch.set_num_threads(self.threads)
        with torch.inference_mode():
            yield

    @property
    def translator(self) -> Translator:
        """The model and its vocabulary, built by the worker thread (`warm_up`) on first use."""
        if self._translator is None:
            self._translator = replace(self.inference.translator(), slots=self.slots)  # lets the checkpoint go
            self.parser = TreeParser.of(self._translator, self.leaves) if self.is_parser else None
        return self._translator

    def warm_up(self) -> None:
        """Build the model in the worker thread, then run one sentence through it, so that the first request
        does not pay for first-call set-up."""
        run_to_end(self.run(self.search, self.prepare(["Hello, world."])))

    def run(
        self,
        search: Any,
        sentences: list[Sentence],
        still_wanted: StillWanted | None = None,
        answer: Answer | None = None,
    ) -> Steps[list[dict[str, Any] | None]]:
        """Search one batch (the worker thread resumes it) one decoder step per resumption (a parser's batch in
        one); returns one JSON-ready result per sentence. `still_wanted` (per sentence, asked once a step): those
        no longer wanted stop at the next step, and get None. `answer` is given a sentence's result as soon as the
        beam search finishes it (`answers_early`), where no sentence asks for an alignment (computed per batch)."""
        translator = self.translator
        generator = sampling_generator(search, self.device)
        if self.parser is not None:
            words = [s.words or [] for s in sentences]
            trees, _ = self.parser.parse(words, search, self.max_tokens, 0, generator, still_wanted)
            answers: list[dict[str, Any] | None] = [{"text": "" if tree is None else str(tree)} for tree in trees]
        else:
            ids = [s.ids for s in sentences]
            lexical = LexicalConstraints([s.phrases for s in sentences]) if any(s.phrases for s in sentences) else None
            forced = prefix_source([np.zeros(0, np.int64) if s.prefix is None else s.prefix for s in sentences])
            rules = all_of(lexical, forced)
            early = (
                partial(self.tell, answer, search)
                if answer is not None and self.answers_early and not any(s.alignment for s in sentences)
                else None
            )
            results = yield from translate_steps(
                translator, ids, search, self.max_tokens, 0, generator, rules, still_wanted, early
            )
            self.align(sentences, results)
            answers = [self.translation(hyps, search.nbest) for hyps in results]
        if still_wanted is None:
            return answers
        return [answer if wanted else None for answer, wanted in zip(answers, still_wanted())]

    def tell(self, answer: Answer, search: SearchConfig, i: int, hyps: list[Hypothesis]) -> None:
        """`run`'s early answer of sentence i, from its hypotheses."""
        answer(i, self.translation(hyps, search.nbest))

    def steps_bound(self, search: SearchConfig, pieces: int) -> int:
        """The most decoder steps a sentence of `pieces` pieces may take: its longest output and EOS."""
        return longest_output(search, pieces, self.max_positions) + 1

    def align(self, sentences: list[Sentence], results: list[list[Hypothesis]]) -> None:
        """Align the hypotheses of the sentences whose request asked (generate's --print-alignment)."""
        for kind in ("hard", "soft"):
            asked = [i for i, s in enumerate(sentences) if s.alignment == kind]
            if asked:
                sources, hyps = [sentences[i].ids for i in asked], [results[i] for i in asked]
                add_alignments(
                    self.translator,
                    sources,
                    hyps,
                    hard=kind == "hard",
                    layer=self.alignment_layer,
                    max_tokens=self.max_tokens,
                )

    def translation(self, hyps: list[Any], nbest: int) -> dict[str, Any]:
        records = [hypothesis_record(h, self.vocab) for h in hyps]
        best: dict[str, Any] = {key: records[0][key] for key in ("text", "score", "alignment") if key in records[0]}
        if not hyps[0].found:
            best["warning"] = NOTHING_FOUND
        return {**best, "nbest": records} if nbest > 1 else best


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


def ensemble_of(inference: Inference) -> dict[str, Any]:
    """/info's `ensemble` (none for one checkpoint): each member's checkpoint, weight, shape and updates."""
    if not inference.others:
        return {}
    members = zip(inference.members, inference.weights)
    return {
        "ensemble": [
            {"checkpoint": str(m.path.resolve()), "weight": w, "model": asdict(m.config), **updates_of(m)}
            for m, w in members
        ]
    }


def updates_of(saved: SavedModel) -> dict[str, Any]:
    """/info's `update`: the checkpoint's; for an average, the newest update averaged (an average records its
    first input's), with the inputs and each one's update (None where an older average did not record them)."""
    if not saved.averaged_from:
        return {"update": saved.update}
    known = [u for u in saved.averaged_updates if u is not None]
    updates = list(saved.averaged_updates) or [None] * len(saved.averaged_from)
    return {
        "update": max(known) if known else None,
        "averaged_from": list(saved.averaged_from),
        "averaged_updates": updates,
    }


def check_text(name: str, text: str) -> None:
    """A text is one line of raw text, as a line of generate's --input (data.raw_text_problem); `name`: the
    request's field for it."""
    if "\n" in text or "\r" in text:
        raise DataError(f"{name}: the text holds a line break; send one sentence per text")
    if problem := raw_text_problem(text):
        raise DataError(f"{name}: the text {problem}")
