"""Token-budget batching: length-bucketed, reshuffled each epoch from (seed, epoch), shardable, resumable.

A batch's budget counts padded tokens including the EOS each side gets: with `n` sentences,
`n * (max_src_len + 1) <= max_tokens` and `n * (max_tgt_len + 1) <= max_tokens`. A pair that cannot
fit on its own is skipped and counted, never truncated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.data.vocab import BOS, EOS, PAD


@dataclass
class Batch:
    """One padded batch. Masks are True at padding."""

    ids: np.ndarray  # [B] sentence indices in the split
    src_tokens: torch.Tensor  # [B, S] source ids + EOS, right-padded
    src_pad_mask: torch.Tensor | None  # [B, S] True at padding; None: no padding (CUDA batches, see train/prefetch.py)
    tgt_in: torch.Tensor  # [B, T] BOS + target ids
    tgt_out: torch.Tensor  # [B, T] target ids + EOS (PAD where padded)
    n_tgt_tokens: int  # non-pad positions of tgt_out
    tgt_index: torch.Tensor | None = None  # [n_tgt_tokens] flat positions of those, when computed on the host

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=nb)

        def move_optional(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else move(t)

        return Batch(
            self.ids,
            move(self.src_tokens),
            move_optional(self.src_pad_mask),
            move(self.tgt_in),
            move(self.tgt_out),
            self.n_tgt_tokens,
            move_optional(self.tgt_index),
        )


def batch_by_tokens(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    rng: np.random.Generator | None,
    max_sentences: int = 0,
    max_positions: int = 0,
) -> tuple[list[np.ndarray], int]:
    """Group sentence indices into batches under the token budget (and at most `max_sentences`, 0: no cap).

    Pairs that need more than `max_positions` positions (a side's length + 1; 0: no limit) are skipped too.

    Sentences are sorted by (target, source) length, ties broken randomly when `rng` is given,
    then packed greedily; the batch order is shuffled with `rng` (kept in length order without).

    Returns:
        (batches, n_skipped): index arrays, and how many pairs exceed `max_tokens` (or `max_positions`)
        on their own.
    """
    src = np.asarray(src_lens, dtype=np.int64) + 1
    tgt = np.asarray(tgt_lens, dtype=np.int64) + 1
    order = rng.permutation(len(src)) if rng is not None else np.arange(len(src))
    order = order[np.lexsort((src[order], tgt[order]))]
    limit = min(max_tokens, max_positions) if max_positions else max_tokens
    fits = (src[order] <= limit) & (tgt[order] <= limit)
    n_skipped = int((~fits).sum())
    order = order[fits]
    batches: list[np.ndarray] = []
    start, max_src, max_tgt = 0, 0, 0
    for pos, i in enumerate(order.tolist()):
        new_src, new_tgt = max(max_src, src[i]), max(max_tgt, tgt[i])
        n = pos - start + 1
        if n * new_src > max_tokens or n * new_tgt > max_tokens or (max_sentences and n > max_sentences):
            batches.append(order[start:pos])
            start, new_src, new_tgt = pos, src[i], tgt[i]
        max_src, max_tgt = new_src, new_tgt
    if start < len(order):
        batches.append(order[start:])
    if rng is not None:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches, n_skipped


def epoch_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
    max_positions: int = 0,
) -> list[np.ndarray]:
    """This rank's batches for `epoch`: a deterministic function of (seed, epoch).

    Ranks take disjoint, interleaved batches; the last `len % world_size` batches of the shuffled
    order are left out this epoch so that every rank gets the same number.
    """
    rng = np.random.default_rng([seed, epoch])
    batches, _ = batch_by_tokens(src_lens, tgt_lens, max_tokens, rng, max_positions=max_positions)
    per_rank = len(batches) // world_size
    return batches[rank::world_size][:per_rank]


def pad_sources(sources: list[np.ndarray]) -> torch.Tensor:
    """[B, S] source ids + EOS, right-padded with PAD: the encoder's input in training and in search."""
    src_tokens = np.full((len(sources), max(len(s) for s in sources) + 1), PAD, dtype=np.int64)
    for row, s in enumerate(sources):
        src_tokens[row, : len(s)] = s
        src_tokens[row, len(s)] = EOS
    return torch.from_numpy(src_tokens)


def collate(dataset: ParallelDataset, ids: np.ndarray, max_positions: int | None = None) -> Batch:
    """Pad a batch; sequences longer than `max_positions` (valid/test only) are cut to fit."""
    limit = (max_positions - 1) if max_positions else None
    tgts = [np.asarray(dataset.tgt[i][:limit], dtype=np.int64) for i in ids]
    src_t = pad_sources([np.asarray(dataset.src[i][:limit], dtype=np.int64) for i in ids])
    n = len(ids)
    tgt_len = max(len(t) for t in tgts) + 1
    tgt_in = np.full((n, tgt_len), PAD, dtype=np.int64)
    tgt_out = np.full((n, tgt_len), PAD, dtype=np.int64)
    for row, t in enumerate(tgts):
        tgt_in[row, 0] = BOS
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = EOS
    tgt_out_t = torch.from_numpy(tgt_out)
    return Batch(
        np.asarray(ids), src_t, src_t.eq(PAD), torch.from_numpy(tgt_in), tgt_out_t, int(sum(len(t) + 1 for t in tgts))
    )


def count_too_long(src_lens: np.ndarray, tgt_lens: np.ndarray, limit: int) -> int:
    """Pairs with a side that needs more than `limit` positions or tokens (its length + 1 for EOS or BOS)."""
    return int(((np.asarray(src_lens) + 1 > limit) | (np.asarray(tgt_lens) + 1 > limit)).sum())
