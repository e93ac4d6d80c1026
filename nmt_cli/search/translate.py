"""The search driver that `nmt generate`, `nmt serve`, training's BLEU validation and the parser share: open a
checkpoint, or an ensemble's checkpoints (search/ensemble.py), for inference (`open_for_inference`: the one way
generate and serve read them) into a Translator, and search a SearchRequest (`translate_steps`): its sources batched
by length, each batch searched, results in input order."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nmt_cli.checkpoint.saved import SavedModel, read_saved_model
from nmt_cli.config import InferenceConfig, SearchConfig, ensemble_weights
from nmt_cli.config.inference import SearchingConfig
from nmt_cli.data.batching import batch_by_tokens, pad_sources
from nmt_cli.data.vocab import PAD, Vocab
from nmt_cli.errors import ConfigError
from nmt_cli.model.linear import ONEDNN_AVAILABLE, pack_for_cpu_inference
from nmt_cli.model.quantize import quantize_for_cpu_inference
from nmt_cli.model.transformer import Transformer
from nmt_cli.runtime import (
    AMP_DTYPES,
    autocast,
    choose_attention_backends,
    choose_device,
    cpu_has_bf16,
    to_device_async,
)
from nmt_cli.search.beam import OnDone, StillWanted, beam_steps, max_lengths
from nmt_cli.search.constraint import ConstraintSource, all_of
from nmt_cli.search.ensemble import Ensemble, check_members, ensemble_bounds, member_paths, member_weights
from nmt_cli.search.greedy import greedy_steps
from nmt_cli.search.hypothesis import Hypothesis
from nmt_cli.search.rules import SentenceRules, rules_source
from nmt_cli.search.settings import SearchBounds, generation_precision, search_bounds, search_settings
from nmt_cli.search.slots import SlotSearch, applies, slot_search_for, slot_steps
from nmt_cli.steps import R, Steps, to_the_end

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Translator:
    """Everything a search needs: the model (or an ensemble of them), its vocabulary, and where and how to run.
    `slots`: plain beam searches run over fixed slots (search/slots.py, chosen by `slot_search_for` where the
    Translator is built: `Inference.translator`); None: beam.py's."""

    model: Transformer | Ensemble
    vocab: Vocab
    device: torch.device
    amp_dtype: torch.dtype | None = None
    slots: SlotSearch | None = None


@dataclass
class Inference:
    """A checkpoint opened to translate with (`open_for_inference`): what it holds (`saved`), where and in which
    precision it runs, and the search settings requests start from. The Translator is built on first use, by
    the thread that searches with it (serve's worker: intra-op thread pools are per thread)."""

    saved: SavedModel  # an ensemble's first checkpoint: its vocabulary, languages, task and search settings
    device: torch.device
    precision: str
    quantize: str | None
    search: SearchConfig
    bounds: SearchBounds  # what each request's search settings must fit (serve checks them per request)
    others: tuple[SavedModel, ...] = ()  # an ensemble's other checkpoints (search/ensemble.py)
    weights: tuple[float, ...] = (1.0,)  # one per member, summing to 1
    slots: SlotSearch | None = None  # how a plain beam search runs (--fixed-slots, --cuda-graphs)
    _translator: Translator | None = field(default=None, repr=False)

    @property
    def members(self) -> tuple[SavedModel, ...]:
        """Every checkpoint translated with: one, or an ensemble's, in --path's order."""
        return (self.saved, *self.others)

    @property
    def max_positions(self) -> int:
        """The positions every member has: the longest input and output."""
        return min(m.config.max_positions for m in self.members)

    def translator(self) -> Translator:
        """The model, or the Ensemble of the members' (built, moved and packed on the first call), and the
        vocabulary."""
        if self._translator is None:
            amp_dtype = AMP_DTYPES[self.precision]
            models = [inference_model(m, self.device, amp_dtype, self.quantize) for m in self.members]
            model = models[0] if not self.others else Ensemble(models, self.weights)
            self._translator = Translator(model, self.saved.vocab, self.device, amp_dtype, self.slots)
            # the models hold their own copies
            self.saved, self.others = self.saved.without_weights(), tuple(m.without_weights() for m in self.others)
        return self._translator


def open_for_inference(cfg: InferenceConfig, search_overrides: dict[str, Any], *, local_rank: int = 0) -> Inference:
    """Read the checkpoint cfg.path once, for generate and serve: the device (GPU `local_rank` under torchrun) and
    its attention kernels, the precision (--precision, else the checkpoint's on CUDA), and the checkpoint's
    search settings with `search_overrides` (search/settings.py refuses those the search would ignore), and for
    the commands that search, how a plain beam search runs (`slot_search_for`).

    cfg.path A.pt:B.pt names an ensemble (search/ensemble.py), weighted by cfg.weights: its checkpoints must share
    the vocabulary, languages and task (CheckpointError naming both files); the first one's training precision
    and search settings are the ensemble's."""
    device = choose_device(cfg.device, local_rank)
    choose_attention_backends(device, cfg.cudnn_attention)
    paths = member_paths(cfg.path)
    weights = member_weights(None if cfg.weights is None else ensemble_weights(cfg.weights), paths)
    members = [read_saved_model(path) for path in paths]
    check_members(members)
    saved = members[0]
    precision = generation_precision(cfg.precision, device, saved.train_precision)
    bounds = ensemble_bounds([search_bounds(m.config, device, precision) for m in members])
    search = search_settings(cfg.path, saved.search, search_overrides, saved.is_parser, bounds)
    slots = slot_search_for(cfg.fixed_slots, cfg.cuda_graphs, device) if isinstance(cfg, SearchingConfig) else None
    return Inference(saved, device, precision, cfg.quantize, search, bounds, tuple(members[1:]), weights, slots)


def load_translator(
    path: Path, device: torch.device, amp_dtype: torch.dtype | None, quantize: str | None = None
) -> tuple[Translator, SavedModel]:
    """The Translator of a checkpoint file, with what else it holds (tests and benchmarks)."""
    saved = read_saved_model(path)
    return Translator(inference_model(saved, device, amp_dtype, quantize), saved.vocab, device, amp_dtype), saved


def inference_model(
    saved: SavedModel, device: torch.device, amp_dtype: torch.dtype | None, quantize: str | None
) -> Transformer:
    """The model of a read checkpoint (a single model's, or each member's of an ensemble), moved to `device`. On
    CPU in float32, and in bf16 where the CPU has bf16 instructions, the linear layers are packed for oneDNN;
    quantize="int8" (CPU, float32 only) makes them dynamic int8 ones instead."""
    if quantize is not None and (device.type != "cpu" or amp_dtype is not None):
        raise ConfigError(f"--quantize {quantize} runs on the CPU in fp32; use --device cpu and --precision fp32")
    model = saved.model().to(device)
    if quantize == "int8":
        quantize_for_cpu_inference(model)
    elif device.type == "cpu" and ONEDNN_AVAILABLE and (amp_dtype is None or packs_bf16(amp_dtype)):
        pack_for_cpu_inference(model, amp_dtype or torch.float32)
    return model


def packs_bf16(amp_dtype: torch.dtype) -> bool:
    """Whether CPU translation under `amp_dtype` autocast packs bfloat16 weights once (PackedLinear): where the CPU
    has bf16 instructions; elsewhere oneDNN has no bf16 product and autocast's emulated one runs."""
    return amp_dtype == torch.bfloat16 and cpu_has_bf16()


@contextmanager
def search_context(translator: Translator) -> Iterator[None]:
    """Inference mode and the translator's autocast, together."""
    with torch.inference_mode(), autocast(translator.device, translator.amp_dtype):
        yield


def each_step_in(translator: Translator, steps: Steps[R]) -> Steps[R]:
    """`steps` with each resumption run inside a fresh `search_context`."""
    while True:
        with search_context(translator):
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value
        yield


def batch_steps(
    translator: Translator,
    sources: Sequence[np.ndarray],
    cfg: SearchConfig,
    *,
    rules: ConstraintSource | None,
    ids: np.ndarray,
    generator: torch.Generator | None,
    still_wanted: StillWanted | None,
    on_done: OnDone | None,
) -> Steps[list[list[Hypothesis]]]:
    """Search one batch, the sources `ids` of a call, one decoder step per resumption (the encoder a layer per
    resumption before them), following `rules` (the call's). The caller runs each resumption in
    `search_context`: serve's worker interleaves the steps of two batches on one thread, and a context held open
    across a pause would leak into the other's."""
    n, n_pieces, model = len(sources), translator.vocab.n_outputs, translator.model  # n_outputs: never a tag
    src, src_pad_mask, src_lens = source_batch(sources, translator.device)
    followed = None if rules is None else rules.for_batch(src, src_lens, ids)
    # A layer of the encoder per resumption: serve's worker runs another batch's steps between the layers of a
    # batch of long sentences instead of waiting for its whole encoder.
    enc = yield from model.encode_steps(src, src_pad_mask)
    if cfg.sampling or cfg.beam == 1:
        if cfg.nbest > 1:  # independent samples: each sentence nbest times in a row
            rep = torch.arange(n).repeat_interleave(cfg.nbest)
            enc, src_lens = enc.select(rep.to(translator.device)), src_lens[rep]
            followed = None if followed is None else (followed[0], followed[1][rep.to(followed[1].device)])
            still_wanted = None if still_wanted is None else repeated(still_wanted, cfg.nbest)
        hyps = yield from greedy_steps(
            model, enc, src_lens, cfg, generator, n_pieces, rules=followed, still_wanted=still_wanted,
        )  # fmt: skip
        return [[h[0] for h in hyps[i * cfg.nbest : (i + 1) * cfg.nbest]] for i in range(n)]
    if translator.slots is not None and applies(cfg, rules is not None):
        graphs = translator.slots.graphs
        return (
            yield from slot_steps(
                model, enc, src_lens, cfg, n_pieces, graphs=graphs, still_wanted=still_wanted, on_done=on_done
            )
        )
    return (
        yield from beam_steps(
            model, enc, src_lens, cfg, n_pieces, rules=followed, still_wanted=still_wanted, on_done=on_done,
        )
    )  # fmt: skip


def source_batch(sources: Sequence[np.ndarray], device: torch.device) -> tuple[Tensor, Tensor | None, Tensor]:
    """A batch of sources (token ids, no EOS) as the encoder takes them: [B, S] ids + EOS, PAD after, on `device`
    (the copy queues behind the device's work instead of waiting for it); the [B, S] padding mask, or None on CUDA
    when every length is equal (SDPA may then choose its Flash kernel; known on the host); and the [B] lengths on
    the host, where the searches read them (no copy back from the device)."""
    src = to_device_async(pad_sources([np.asarray(s, dtype=np.int64) for s in sources]), device)
    lengths = [len(s) for s in sources]
    no_padding = device.type == "cuda" and min(lengths) == max(lengths)
    return src, None if no_padding else src.eq(PAD), torch.tensor(lengths)


def tell_source(on_done: OnDone, ids: np.ndarray, i: int, hyps: list[Hypothesis]) -> None:
    """`on_done` of a batch of the sources `ids`: its sentence i is the source ids[i]."""
    on_done(int(ids[i]), hyps)


def repeated(still_wanted: StillWanted, n: int) -> StillWanted:
    """`still_wanted` for a batch that holds each sentence n times in a row (n samples of each)."""
    return lambda: [w for w in still_wanted() for _ in range(n)]


def subset(still_wanted: StillWanted, ids: np.ndarray) -> StillWanted:
    """`still_wanted` of a batch of the sentences `ids` (indices into the sentences `still_wanted` answers for)."""

    def wanted() -> list[bool]:
        answers = still_wanted()
        return [bool(answers[i]) for i in ids]

    return wanted


def sampling_generator(cfg: SearchConfig, device: torch.device) -> torch.Generator | None:
    """The random generator of a sampling run, seeded with cfg.seed (None when searching)."""
    return torch.Generator(device=device).manual_seed(cfg.seed) if cfg.sampling else None


@dataclass(frozen=True)
class SearchRequest:
    """One call of the search driver (`translate_steps`): the sources (token ids, no EOS), their search settings, the
    batches' bounds (max_tokens source tokens, batch_size sentences, 0: no cap), each source's decoding rules
    (search/rules.py, or none), and a task's own ConstraintSource (a parser's trees, search/constraint.py)."""

    sources: Sequence[np.ndarray]
    search: SearchConfig
    max_tokens: int
    batch_size: int = 0
    rules: Sequence[SentenceRules] = ()
    constraints: ConstraintSource | None = None


def translate_steps(
    translator: Translator,
    request: SearchRequest,
    *,
    generator: torch.Generator | None = None,
    still_wanted: StillWanted | None = None,
    on_done: OnDone | None = None,
) -> Steps[list[list[Hypothesis]]]:
    """Translate the request's sources, one decoder step per resumption (serve's worker interleaves two batches);
    each source's results, in input order. `still_wanted` and `on_done` (search/beam.py) answer and are told by
    source index; a batch of sources none still wants is not searched.

    Empty sources get empty hypotheses without running the model; sources longer than the model's positions are
    cut (with a warning). Sampling draws from `generator` (a caller translating in chunks passes one for them all:
    `sampling_generator`), else from one seeded with cfg.seed."""
    cfg = request.search
    sources = cut_to_positions(request.sources, translator.model.max_positions - 1, "input(s)")
    lengths = np.array([len(s) for s in sources], dtype=np.int64)
    # An empty input gets --nbest empty hypotheses, as every other input gets --nbest: outputs read in groups
    # of N stay aligned.
    results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, []) for _ in range(cfg.nbest)] for _ in sources]
    generator = generator or sampling_generator(cfg, translator.device)
    warn_short(lengths[lengths > 0], cfg, translator.model.max_positions)
    rules = all_of(request.constraints, rules_source(request.rules, cfg))
    nonempty = np.flatnonzero(lengths > 0)
    budget = max(request.max_tokens, int(lengths.max(initial=0)) + 1)  # every sentence fits: none is skipped
    batches, _ = batch_by_tokens(lengths[nonempty], lengths[nonempty], budget, None, request.batch_size)
    for batch in batches:
        ids = nonempty[batch]
        wanted = None if still_wanted is None else subset(still_wanted, ids)
        if wanted is not None and not any(wanted()):
            continue
        steps = batch_steps(
            translator, [sources[i] for i in ids], cfg, rules=rules, ids=ids, generator=generator, still_wanted=wanted,
            on_done=None if on_done is None else partial(tell_source, on_done, ids),
        )  # fmt: skip
        hyps_of = yield from each_step_in(translator, steps)
        for i, hyps in zip(ids, hyps_of):
            results[i] = hyps
    return results


def cut_to_positions(sequences: Sequence[np.ndarray], limit: int, what: str) -> list[np.ndarray]:
    """Each sequence cut to `limit` ids (the model's positions less one, as the search cuts and ends its outputs),
    with one warning counting those cut."""
    n_cut = sum(len(s) > limit for s in sequences)
    if n_cut:
        logger.warning("%d %s longer than the model's %d positions were truncated", n_cut, what, limit)
    return [np.asarray(s[:limit], dtype=np.int64) for s in sequences]


def warn_short(lengths: np.ndarray, cfg: SearchConfig, max_positions: int) -> None:
    """Warn of the sources of these lengths whose outputs may hold fewer than --min-len pieces."""
    n_short = int(np.count_nonzero(max_lengths(torch.from_numpy(lengths), cfg, max_positions).numpy() < cfg.min_len))
    if n_short:
        logger.warning(
            "%d input(s) allow fewer than --min-len %d pieces (--max-len-a/--max-len-b or the model's positions); "
            "they end at their maximum length",
            n_short,
            cfg.min_len,
        )


translate = to_the_end(translate_steps)


@dataclass
class Summary:
    n_sentences: int = 0
    n_tokens: int = 0
    seconds: float = 0.0

    def add(self, results: list[list[Hypothesis]], seconds: float) -> None:
        self.n_sentences += len(results)
        self.n_tokens += sum(len(h.tokens) + 1 for hyps in results for h in hyps[:1])
        self.seconds += seconds
