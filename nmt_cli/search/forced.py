"""Teacher-forced passes: the decoder run over a given target (BOS + target -> target + EOS) for every position at
once, one encoder and one decoder pass per batch. `forced_scores` scores given (source, target) pairs with the
search's own conventions (`nmt score-pairs`: a hypothesis the search produced scores its search score, fp32 within
1e-4); `add_alignments` aligns the search's outputs to their sources by one decoder layer's encoder-decoder
attention averaged over heads (`nmt generate --print-alignment`).

Shapes: B pairs in a batch, S source length with EOS, T target length with EOS, D d_model, H heads, V vocabulary."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.batching import batch_by_tokens
from nmt_cli.data.vocab import BOS, EOS, PAD, UNK
from nmt_cli.errors import ConfigError
from nmt_cli.model.transformer import AttentionWeights, Transformer, normalise_logits
from nmt_cli.runtime import to_device_async
from nmt_cli.search.beam import length_penalty
from nmt_cli.search.ensemble import Ensemble
from nmt_cli.search.hypothesis import Alignment, Hypothesis
from nmt_cli.search.searchable import SearchModel
from nmt_cli.search.translate import Translator, cut_to_positions, search_context, source_batch


@dataclass
class PairScore:
    """The model's score of one given (source, target) pair."""

    tokens: list[int]  # the target's ids as scored (cut to the model's positions), without EOS
    token_scores: list[float]  # the model's log-prob of each token, EOS included (nats)
    log_prob: float  # their sum
    score: float  # as the search scores: (log_prob - unkpen * unknown pieces) / length_penalty(len(tokens) + 1)


@dataclass
class ForcedBatch:
    """A batch of pairs laid out for one teacher-forced pass."""

    src: Tensor  # [B, S] source ids + EOS, PAD after
    src_pad_mask: Tensor | None  # [B, S] True at padding; None: no padding (CUDA, equal lengths, as the search)
    tgt_in: Tensor  # [B, T] BOS + target, PAD after
    tgt_out: Tensor  # [B, T] target + EOS, PAD after


def forced_batch(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], device: torch.device) -> ForcedBatch:
    """The padded tensors of these pairs on `device`; the source side as the search pads it (translate.batch_steps)."""
    src, src_pad_mask, _ = source_batch(sources, device)
    width = max(len(t) for t in targets) + 1
    tgt_in = np.full((len(targets), width), PAD, dtype=np.int64)
    tgt_out = np.full((len(targets), width), PAD, dtype=np.int64)
    for row, t in enumerate(targets):
        tgt_in[row, 0], tgt_in[row, 1 : len(t) + 1] = BOS, t
        tgt_out[row, : len(t)], tgt_out[row, len(t)] = t, EOS
    return ForcedBatch(
        src,
        src_pad_mask,
        to_device_async(torch.from_numpy(tgt_in), device),  # queued behind the last pass, not waiting for it
        to_device_async(torch.from_numpy(tgt_out), device),
    )


def target_log_probs(model: Transformer, batch: ForcedBatch) -> Tensor:
    """One model's log-prob of each target token and EOS given the source and the tokens before it: [B, T] float32,
    0 at padding. The output projection runs at the real positions only. (An ensemble combines these per member.)"""
    hidden = model.decode(batch.tgt_in, model.encode(batch.src, batch.src_pad_mask))  # [B, T, D]
    real = batch.tgt_out.ne(PAD)  # [B, T]
    normalised = normalise_logits(model.logits(hidden[real]))  # [N, V] float32, as the search's steps normalise
    picked = normalised.gather(1, batch.tgt_out[real][:, None])[:, 0]  # [N]
    return torch.zeros(real.shape, device=normalised.device).masked_scatter(real, picked)


def cross_attention(model: Transformer, batch: ForcedBatch, layer: int) -> Tensor:
    """Decoder layer `layer`'s encoder-decoder attention averaged over heads: [B, T, S] float32, row t the weights
    with which target position t (predicting token t) read the source; 0 at source padding."""
    weights = AttentionWeights()
    model.decode(batch.tgt_in, model.encode(batch.src, batch.src_pad_mask), weights)
    return weights.cross[layer].float().mean(1)  # [B, H, T, S] -> [B, T, S]


def per_member(model: SearchModel, one: Callable[[Transformer], Tensor]) -> Tensor:
    """`one` of a model; of an Ensemble, the weighted sum of its members' (the weights sum to 1), as its search
    steps combine the members' log-probs: a hypothesis an ensemble produced scores its search score."""
    if not isinstance(model, Ensemble):
        assert isinstance(model, Transformer)
        return one(model)
    parts = [one(member) * weight for member, weight in zip(model.members, model.weights)]
    return torch.stack(parts).sum(0)


def pair_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, batch_size: int) -> list[np.ndarray]:
    """Indices of the pairs, batched as the search batches (by target, then source length): at most `max_tokens`
    padded tokens on each side (EOS included) and `batch_size` pairs (0: no cap), a pair over the budget on its
    own alone; then each batch cut where its targets grow past a quarter (and two) above its shortest. Every
    position of the pass costs as much as a real one, so that cut keeps the padding small; a search's batch
    needs none, since a sentence leaves it once finished."""
    if len(src_lens) == 0:
        return []
    budget = max(max_tokens, int(src_lens.max()) + 1, int(tgt_lens.max()) + 1)
    batches, _ = batch_by_tokens(src_lens, tgt_lens, budget, None, batch_size)
    return [part for batch in batches for part in split_by_length(batch, tgt_lens)]


def split_by_length(batch: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """A batch of indices sorted by `lengths`, cut where a length passes 5/4 of its part's first plus two."""
    parts, start = [], 0
    for pos in range(1, len(batch)):
        if lengths[batch[pos]] > lengths[batch[start]] * 5 // 4 + 2:
            parts.append(batch[start:pos])
            start = pos
    parts.append(batch[start:])
    return parts


def forced_scores(
    translator: Translator,
    sources: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    search: SearchConfig,
    max_tokens: int,
    batch_size: int = 0,
) -> list[PairScore]:
    """Score each (source, target) pair of token ids (no EOS), in input order, by one teacher-forced pass per batch.

    The score follows the search's conventions (search.lenpen, lenpen_style, unkpen), so that a hypothesis the
    search produced scores its search score. Sources and targets longer than the model's positions are cut (with a
    warning), as the search cuts its inputs and ends its outputs; a cut target is scored ending in EOS there.
    """
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    limit = translator.model.max_positions - 1
    sources = cut_to_positions(sources, limit, "source(s)")
    targets = cut_to_positions(targets, limit, "target(s)")
    src_lens = np.array([len(s) for s in sources], dtype=np.int64)
    tgt_lens = np.array([len(t) for t in targets], dtype=np.int64)
    scores: list[PairScore | None] = [None] * len(sources)

    def launch(ids: np.ndarray) -> Tensor:
        batch = forced_batch([sources[i] for i in ids], [targets[i] for i in ids], translator.device)
        with search_context(translator):
            return per_member(translator.model, partial(target_log_probs, batch=batch))  # [B, T]

    def read(ids: np.ndarray, log_probs: np.ndarray) -> None:
        for row, i in enumerate(ids):
            scores[i] = pair_score(targets[i], log_probs[row, : len(targets[i]) + 1], search)

    overlapped(pair_batches(src_lens, tgt_lens, max_tokens, batch_size), launch, read)
    assert all(s is not None for s in scores), "every pair is in one batch"
    return scores  # type: ignore[return-value]


def pair_score(tokens: np.ndarray, token_scores: np.ndarray, search: SearchConfig) -> PairScore:
    """The PairScore of a target's tokens (no EOS) from the log-probs of its tokens and EOS."""
    log_prob = float(token_scores.sum(dtype=np.float64))
    penalised = log_prob - search.unkpen * int(np.count_nonzero(tokens == UNK))
    score = penalised / length_penalty(len(tokens) + 1, search.lenpen, search.lenpen_style)
    return PairScore(tokens.tolist(), token_scores.tolist(), log_prob, score)


def alignment_layer(layer: int | None, decoder_layers: int) -> int:
    """The decoder layer to align with: `layer` (--alignment-layer, 0 the bottom one), else the penultimate one,
    whose encoder-decoder attention aligns best in a vanilla Transformer (Garg et al. 2019; the last one of a
    one-layer decoder)."""
    if layer is None:
        return max(decoder_layers - 2, 0)
    if layer >= decoder_layers:
        raise ConfigError(
            f"--alignment-layer {layer}: the checkpoint's decoder has {decoder_layers} layers (0 to "
            f"{decoder_layers - 1}); give one of them"
        )
    return layer


def add_alignments(
    translator: Translator,
    sources: Sequence[np.ndarray],
    results: Sequence[Sequence[Hypothesis]],
    *,
    hard: bool,
    layer: int,
    max_tokens: int,
    batch_size: int = 0,
) -> None:
    """Set the `alignment` of every hypothesis of `results` (translate's, for `sources`) from decoder layer `layer`'s
    encoder-decoder attention over a teacher-forced pass of the hypothesis, averaged over heads: for each of its
    tokens (EOS excluded) the weights over the source's pieces (EOS excluded), renormalised to sum to 1."""
    limit = translator.model.max_positions - 1
    hyps = [(np.asarray(sources[i][:limit], dtype=np.int64), h) for i, group in enumerate(results) for h in group]
    for src, h in hyps:
        if not h.tokens:  # nothing to align (an empty source gets empty hypotheses): no pass
            h.alignment = Alignment(np.zeros((0, len(src)), dtype=np.float32), hard)
    todo = [(src, np.asarray(h.tokens, dtype=np.int64), h) for src, h in hyps if h.tokens]
    src_lens = np.array([len(s) for s, _, _ in todo], dtype=np.int64)
    tgt_lens = np.array([len(t) for _, t, _ in todo], dtype=np.int64)

    def launch(ids: np.ndarray) -> Tensor:
        batch = forced_batch([todo[i][0] for i in ids], [todo[i][1] for i in ids], translator.device)
        with search_context(translator):
            return per_member(translator.model, partial(cross_attention, batch=batch, layer=layer))  # [B, T, S]

    def read(ids: np.ndarray, attention: np.ndarray) -> None:
        for row, i in enumerate(ids):
            src, tgt, h = todo[i]
            h.alignment = Alignment(normalised_rows(attention[row, : len(tgt), : len(src)]), hard)

    overlapped(pair_batches(src_lens, tgt_lens, max_tokens, batch_size), launch, read)


def overlapped(
    batches: list[np.ndarray], launch: Callable[[np.ndarray], Tensor], read: Callable[[np.ndarray, np.ndarray], None]
) -> None:
    """`launch` each batch's pass, and `read` its result on the host once the next batch's pass is launched: on CUDA
    the host's part of one batch overlaps the device's of the next (the copies in are non-blocking: forced_batch)."""
    pending: tuple[np.ndarray, Tensor] | None = None
    for ids in batches:
        result = launch(ids)
        if pending is not None:
            read(pending[0], pending[1].cpu().numpy())
        pending = (ids, result)
    if pending is not None:
        read(pending[0], pending[1].cpu().numpy())


def normalised_rows(weights: np.ndarray) -> np.ndarray:
    """[T, S] weights scaled to sum to 1 per row (uniform where a row holds no weight at all)."""
    sums = weights.sum(1, keepdims=True)
    uniform = np.full_like(weights, 1.0 / max(weights.shape[1], 1))
    return np.divide(weights, sums, out=uniform, where=sums > 0).astype(np.float32)
