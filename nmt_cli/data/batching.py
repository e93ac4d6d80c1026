"""Token-budget batching: length-sorted once a run, drawn and reshuffled each epoch from (seed, epoch).

A batch's budget counts padded tokens with each side's EOS: `n * (max_len + 1) <= max_tokens` on both sides. A pair
that cannot fit on its own is skipped and counted, never truncated. With `--bucket-shapes` lengths and sentence
counts come from small grids (`bucket_length`, `bucket_count`), so the same few shapes come back all epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

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
        """The batch's tensors on `device` (a non-blocking copy to CUDA)."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self)}
        nb = device.type == "cuda"
        moved: dict[str, Any] = {k: t.to(device, non_blocking=nb) for k, t in tensors.items() if torch.is_tensor(t)}
        return replace(self, **moved)


def batch_by_tokens(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    rng: np.random.Generator | None,
    max_sentences: int = 0,
    max_positions: int = 0,
) -> tuple[list[np.ndarray], int]:
    """(batches, n_skipped): sentence indices grouped under the token budget (and at most `max_sentences`, 0: no
    cap), and how many pairs exceed `max_tokens` or `max_positions` (a side's length + 1; 0: no limit) alone.

    Sorted by (target, source) length, ties broken by `rng`, packed greedily; the batch order shuffled by `rng`.
    """
    src = np.asarray(src_lens, dtype=np.int64) + 1
    tgt = np.asarray(tgt_lens, dtype=np.int64) + 1
    order = rng.permutation(len(src)) if rng is not None else np.arange(len(src))
    order = order[np.lexsort((src[order], tgt[order]))]
    limit = bucket_limit(max_tokens, max_positions)
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


def bucket_limit(max_tokens: int, max_positions: int) -> int:
    """The longest a bucketed side may be padded to: the budget, and the model's positions (0: no limit)."""
    return min(max_tokens, max_positions) if max_positions else max_tokens


def bucket_length(n: int, limit: int = 0) -> int:
    """n positions rounded up to the length grid: multiples of 4, four sizes per doubling (4, 8, ..., 32, 40, 48,
    56, 64, 80, ...), at most 25% padding above 16; capped at `limit` (0: none) when n fits it."""
    n = int(n)  # a NumPy integer has no bit_length
    step = max(4, 1 << max(0, (n - 1).bit_length() - 3))
    size = -(-n // step) * step
    return min(size, limit) if limit and n <= limit else size


def bucket_count(n: int) -> int:
    """The largest sentence count of the count grid not above n (n >= 1): 1-8, then four per doubling
    (10, 12, 14, 16, 20, 24, 28, 32, 40, ...)."""
    n = int(n)
    step = 1 << max(0, n.bit_length() - 3)
    return n // step * step


def batch_by_shapes(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, rng: np.random.Generator | None, max_positions: int = 0
) -> tuple[list[np.ndarray], int]:
    """`batch_by_tokens` with each side's length its `bucket_length` and each batch's size a `bucket_count`; a
    batch that stops at a count off the grid gives its last sentences to the next one."""
    limit = bucket_limit(max_tokens, max_positions)
    src = np.asarray(src_lens, dtype=np.int64) + 1
    tgt = np.asarray(tgt_lens, dtype=np.int64) + 1
    fits = (src <= limit) & (tgt <= limit)
    grid = np.array([bucket_length(n, limit) for n in range(limit + 1)], dtype=np.int64)  # by length, to limit
    src_b, tgt_b = grid[src.clip(max=limit)], grid[tgt.clip(max=limit)]
    order = rng.permutation(len(src)) if rng is not None else np.arange(len(src))
    order = order[np.lexsort((src_b[order], tgt_b[order]))]
    order = order[fits[order]]
    sorted_src, sorted_tgt = src_b[order].tolist(), tgt_b[order].tolist()
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        n = bucket_count(_n_fitting(sorted_src, sorted_tgt, start, max_tokens))
        batches.append(order[start : start + n])
        start += n
    if rng is not None:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches, int((~fits).sum())


def _n_fitting(src: list[int], tgt: list[int], start: int, max_tokens: int) -> int:
    """How many sentences from position `start` of the sorted bucketed lengths on fit the budget (at least one)."""
    max_src = max_tgt = n = 0
    while start + n < len(src):
        max_src, max_tgt = max(max_src, src[start + n]), max(max_tgt, tgt[start + n])
        if (n + 1) * max_src > max_tokens or (n + 1) * max_tgt > max_tokens:
            break
        n += 1
    return max(n, 1)


@dataclass
class PaddingStats:
    """Positions of a set of batches, real (tokens + EOS) and trained (padded), and their (B, S, T) shapes."""

    real: int = 0
    trained: int = 0
    shapes: set[tuple[int, int, int]] = field(default_factory=set)

    def padding(self) -> float:
        """Padded positions as a share of those trained."""
        return 1.0 - self.real / self.trained if self.trained else 0.0


def padding_stats(
    batches: list[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray, bucket_limit: int = 0
) -> PaddingStats:
    """Source and target positions of `batches` together, padded as `collate` pads them with `bucket_limit`."""
    stats = PaddingStats()
    for ids in batches:
        src, tgt = np.asarray(src_lens)[ids] + 1, np.asarray(tgt_lens)[ids] + 1
        s, t = padded_lengths(int(src.max()), int(tgt.max()), bucket_limit)
        stats.real += int(src.sum() + tgt.sum())
        stats.trained += len(ids) * (s + t)
        stats.shapes.add((len(ids), s, t))
    return stats


def compare_padding(
    bucketed: list[np.ndarray], plain: list[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray, bucket_limit: int
) -> str:
    """One line on bucketed batches against the plain ones of the same pairs: batches, shapes and padding."""
    ours, theirs = padding_stats(bucketed, src_lens, tgt_lens, bucket_limit), padding_stats(plain, src_lens, tgt_lens)
    return (
        f"{len(bucketed)} batches in {len(ours.shapes)} shapes, {100 * ours.padding():.1f}% of their source and "
        f"target positions padding; unbucketed {len(plain)} batches in {len(theirs.shapes)} shapes, "
        f"{100 * theirs.padding():.1f}% padding: bucketing trains {100 * (ours.trained / theirs.trained - 1):.1f}% "
        "more positions"
    )


def padded_lengths(src_len: int, tgt_len: int, bucket_limit: int) -> tuple[int, int]:
    """A batch's [S, T] from its longest positions (EOS included): those, or with bucket_limit their buckets."""
    if not bucket_limit:
        return src_len, tgt_len
    return bucket_length(src_len, bucket_limit), bucket_length(tgt_len, bucket_limit)


BATCHING = 0x6261746368  # "batch": the random stream of the batching, apart from the epochs' [seed, epoch]


def length_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int,
    *,
    max_positions: int = 0,
    bucket_shapes: bool = False,
    corpus: int = 0,
) -> list[np.ndarray]:
    """A run's batches of its `corpus`-th corpus, made once (the slow part), length ties broken from `seed`; each
    epoch draws and orders them (`draw_batches`), as fairseq does."""
    rng = np.random.default_rng([seed, BATCHING, corpus])
    make = batch_by_shapes if bucket_shapes else batch_by_tokens
    return make(src_lens, tgt_lens, max_tokens, rng, max_positions=max_positions)[0]


def draw_batches(
    corpora: list[list[np.ndarray]], weights: list[float], rng: np.random.Generator
) -> tuple[list[np.ndarray], list[int]]:
    """An epoch's shuffled batches and the pairs drawn from each corpus: a corpus of weight w gives every batch
    int(w) times, then a random share of its batches holding (w - int(w)) of its pairs."""
    drawn: list[np.ndarray] = []
    n_pairs = []
    for batches, weight in zip(corpora, weights):
        whole, share = divmod(weight, 1.0)
        chosen = batches * int(whole)
        if share and batches:
            order = rng.permutation(len(batches))
            sizes = np.cumsum([len(batches[j]) for j in order])
            chosen += [batches[j] for j in np.sort(order[: int(np.searchsorted(sizes, share * sizes[-1]))])]
        drawn += chosen
        n_pairs.append(sum(len(b) for b in chosen))
    return [drawn[j] for j in rng.permutation(len(drawn))], n_pairs


def rank_share(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """A rank's batches, interleaved; the last `len % world_size` left out so that every rank gets as many."""
    return batches[rank::world_size][: len(batches) // world_size]


def epoch_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    max_positions: int = 0,
    bucket_shapes: bool = False,
) -> list[np.ndarray]:
    """This rank's batches of one corpus for `epoch`, as `nmt train` draws them. The peer harness calls it with
    five positional arguments; keep them so (tests/test_peers.py)."""
    batches = length_batches(
        src_lens, tgt_lens, max_tokens, seed, max_positions=max_positions, bucket_shapes=bucket_shapes
    )
    return rank_share(draw_batches([batches], [1.0], np.random.default_rng([seed, epoch]))[0], rank, world_size)


def pad_sources(sources: list[np.ndarray], length: int = 0) -> torch.Tensor:
    """[B, S] source ids + EOS, right-padded with PAD to the longest (or to `length`, when given)."""
    src_tokens = np.full((len(sources), length or max(len(s) for s in sources) + 1), PAD, dtype=np.int64)
    for row, s in enumerate(sources):
        src_tokens[row, : len(s)] = s
        src_tokens[row, len(s)] = EOS
    return torch.from_numpy(src_tokens)


def collate(
    dataset: ParallelDataset, ids: np.ndarray, max_positions: int | None = None, bucket_limit: int = 0
) -> Batch:
    """Pad a batch to its longest, or with bucket_limit to its `bucket_length`; sequences longer than
    `max_positions` (valid/test only) are cut to fit."""
    limit = (max_positions - 1) if max_positions else None
    tgts = [np.asarray(dataset.tgt[i][:limit], dtype=np.int64) for i in ids]
    srcs = [np.asarray(dataset.src[i][:limit], dtype=np.int64) for i in ids]
    src_len, tgt_len = padded_lengths(max(len(s) for s in srcs) + 1, max(len(t) for t in tgts) + 1, bucket_limit)
    src_t = pad_sources(srcs, src_len)
    n = len(ids)
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
