"""The batcher worker's side of a served model: the model it builds, a batch of sentences searched with generate's
own driver (search/translate.py, or parsing's for a parser), aligned where a request asks (search/forced.py), and
written as /translate's answers. A batch handed to `translate_steps` fits its token budget, so it runs as one batch:
a request's sentences get what generate writes for the same sentences batched the same way.

The model is built (and packed for the CPU) in the worker thread, by the warm-up: intra-op thread pools are per
thread, and when the main thread's pool packs the model, the worker's own pool competes with it for the cores and
searches far slower (benchmarks/bench_serve.py measures the server).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import Vocab
from nmt_cli.parsing.parser import TreeParser
from nmt_cli.search.beam import StillWanted
from nmt_cli.search.forced import add_alignments, alignment_layer
from nmt_cli.search.hypothesis import NOTHING_FOUND, Hypothesis, hypothesis_record
from nmt_cli.search.settings import available_memory, longest_output, search_batch_size
from nmt_cli.search.translate import Inference, SearchRequest, Translator, sampling_generator, translate_steps
from nmt_cli.serve.queued import Answer
from nmt_cli.serve.request import Sentence
from nmt_cli.steps import Steps


class BatchSearch:
    """A served model's translator, built by the worker thread on first use, and its search of a batch."""

    def __init__(self, inference: Inference, *, max_tokens: int) -> None:
        self.inference, self.max_tokens = inference, max_tokens
        self.device, self.vocab = inference.device, inference.saved.vocab
        self.max_positions = inference.max_positions
        self.threads = torch.get_num_threads()  # as set_threads left it in the main thread
        layers = min(m.config.decoder_layers for m in inference.members)  # an ensemble's: every member's
        self.alignment_layer = alignment_layer(None, layers)  # generate's default
        # Answer a sentence as its beam search finishes it, on a GPU: the event loop answers and reads the clients
        # on host cores the search leaves free. On the CPU the search's threads take every core, and the clients
        # handled beside its steps slowed it more than their early return gained (benchmarks/record/serve.md).
        self.answers_early = self.device.type == "cuda"
        self._translator: Translator | None = None
        self.parser: TreeParser | None = None

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
        """The model and its vocabulary, built by the worker thread (the warm-up) on first use."""
        if self._translator is None:
            saved = self.inference.saved
            self._translator = self.inference.translator()  # lets the checkpoint go
            self.parser = TreeParser.of(self._translator, saved.tree_leaves) if saved.is_parser else None
        return self._translator

    def run(
        self,
        search: SearchConfig,
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
        # as generate: the batch's sentences split so that their rows fit in the memory the device has now
        longest = max((len(s.ids) for s in sentences), default=1)
        have = available_memory(self.device)
        batch_size = search_batch_size(search, self.inference.bounds, longest, batch_size=0, have=have)
        if self.parser is not None:
            words = [s.words or [] for s in sentences]
            trees, _ = self.parser.parse(words, search, self.max_tokens, batch_size, generator, still_wanted)
            answers: list[dict[str, Any] | None] = [{"text": "" if tree is None else str(tree)} for tree in trees]
        else:
            ids = [s.ids for s in sentences]
            early = (
                partial(self.tell, answer, search)
                if answer is not None and self.answers_early and not any(s.alignment for s in sentences)
                else None
            )
            request = SearchRequest(ids, search, self.max_tokens, batch_size, rules=[s.rules for s in sentences])
            results = yield from translate_steps(
                translator, request, generator=generator, still_wanted=still_wanted, on_done=early
            )
            self.align(sentences, results)
            answers = [translation(hyps, search.nbest, self.vocab) for hyps in results]
        if still_wanted is None:
            return answers
        return [answer if wanted else None for answer, wanted in zip(answers, still_wanted())]

    def tell(self, answer: Answer, search: SearchConfig, i: int, hyps: list[Hypothesis]) -> None:
        """`run`'s early answer of sentence i, from its hypotheses."""
        answer(i, translation(hyps, search.nbest, self.vocab))

    def cost(self, search: SearchConfig, pieces: int) -> int:
        """The tokens the search of a sentence of `pieces` pieces may take: its rows (the beam, or the samples) at
        each step of its longest output and EOS."""
        return max(search.beam, search.nbest) * (longest_output(search, pieces, self.max_positions) + 1)

    def align(self, sentences: Sequence[Sentence], results: list[list[Hypothesis]]) -> None:
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


def translation(hyps: list[Hypothesis], nbest: int, vocab: Vocab) -> dict[str, Any]:
    """A sentence's answer: its best hypothesis' text, score and alignment (where asked), with a warning where the
    search found no hypothesis that ends, and all `nbest` hypotheses where more than one is asked for."""
    records = [hypothesis_record(h, vocab) for h in hyps]
    best: dict[str, Any] = {key: records[0][key] for key in ("text", "score", "alignment") if key in records[0]}
    if not hyps[0].found:
        best["warning"] = NOTHING_FOUND
    return {**best, "nbest": records} if nbest > 1 else best
