"""The decoder's state over fixed slots: every row keeps its place, and each layer's self-attention keys and values
live in buffers preallocated to the batch's longest output, written in place at the step's position
(`Transformer.decode_slots`), so that a step can be captured once as a CUDA graph and replayed.

Shapes: B sentences, K beams, N = B*K rows (row = sentence * K + beam), H heads, L preallocated positions,
S source length, Dk key size and Dh value size per head.

No tensor of a step changes shape or address: each row's position is a device tensor (`step`, [N]), beams are
reordered by copying within the buffers, positions not yet written are masked, and idle rows parked (`park`). Once
few sentences are left, the live ones move to a cache of fewer slots (`select`, `load`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

NEG_INF = float("-inf")


@dataclass
class SlotCache:
    self_k: list[Tensor]  # per decoder layer [N, H, L, Dk], position t written at step t
    self_v: list[Tensor]  # per decoder layer [N, H, L, Dh]
    cross_k: list[Tensor]  # per decoder layer [B, H, S, Dk], computed once per batch
    cross_v: list[Tensor]  # per decoder layer [B, H, S, Dh]
    cross_bias: Tensor | None  # [B, 1, 1, S] added to cross-attention scores: 0, -inf at padding; None: no padding
    step: Tensor  # [N] long: the position each row's next step writes
    positions: Tensor  # [L] long, 0..L-1: compared with `step` for the mask of positions not yet written

    @property
    def n_positions(self) -> int:
        """L, the positions preallocated."""
        return self.self_k[0].shape[2]

    def reorder(self, rows: Tensor, window: int) -> None:
        """Row i continues row rows[i] [N]: keys and values reordered over the first `window` positions, within
        their own buffers, which keep their addresses."""
        for buf in (*self.self_k, *self.self_v):
            written = buf[:, :, :window]
            written.copy_(written.index_select(0, rows))

    def self_bias(self, window: int) -> Tensor:
        """[N, 1, 1, window] scores to add over the first `window` positions: 0 up to each row's own, -inf beyond
        (not yet written)."""
        zero = self.step.new_zeros((), dtype=self.self_k[0].dtype)
        return torch.where(self.positions[:window] > self.step[:, None], NEG_INF, zero)[:, None, None, :]

    def select(self, sentences: Tensor, rows: Tensor) -> SlotCache:
        """A cache of fewer slots: the sentences `sentences` [B'] alone, row i continuing row rows[i] ([B'*K], rows
        of those sentences), at the same step, in new buffers of the same L positions (all copied: positions past
        the step are read, masked, and so must hold no uninitialised memory)."""
        return SlotCache(
            [buf.index_select(0, rows) for buf in self.self_k],
            [buf.index_select(0, rows) for buf in self.self_v],
            [k[sentences] for k in self.cross_k],  # indexing keeps their memory layout (init_cache's)
            [v[sentences] for v in self.cross_v],
            None if self.cross_bias is None else self.cross_bias.index_select(0, sentences),
            self.step.index_select(0, rows),
            self.positions,
        )

    def load(self, other: SlotCache, written: int) -> None:
        """Take `other`'s batch into these buffers: its cross-attention keys, values and bias, its first `written`
        self-attention positions and its step (a new batch: 0 and 0; a batch moved to fewer slots: its positions
        so far). The buffers keep their addresses, so a step captured over them replays for `other`'s batch.
        `other` must have this cache's shapes (the same bucket)."""
        for mine, theirs in zip([*self.cross_k, *self.cross_v], [*other.cross_k, *other.cross_v]):
            assert mine.shape == theirs.shape, "a batch is loaded only into a cache of its own shapes"
            mine.copy_(theirs)
        for mine, theirs in zip([*self.self_k, *self.self_v], [*other.self_k, *other.self_v]):
            assert mine.shape == theirs.shape, "a batch is loaded only into a cache of its own shapes"
            mine[:, :, :written].copy_(theirs[:, :, :written])
        assert (self.cross_bias is None) == (other.cross_bias is None), "both caches pad their sources, or neither"
        if self.cross_bias is not None and other.cross_bias is not None:
            self.cross_bias.copy_(other.cross_bias)
        self.step.copy_(other.step)

    def steps(self) -> Tensor:
        """A copy of the rows' positions, for `restart`."""
        return self.step.clone()

    def restart(self, steps: Tensor) -> None:
        """Go back to the rows' positions `steps` [N] (a copy of `step` taken before; what is written beyond is
        masked until written again)."""
        self.step.copy_(steps)

    def park(self, rows: Tensor) -> None:
        """Put the rows `rows` [N] bool (those of sentences no longer searching) back at position 0: their steps go
        on, masked, and never write past the buffers however long the others search."""
        self.step.masked_fill_(rows, 0)


def rows_of(slots: Tensor, k: int) -> Tensor:
    """[A] slots -> [A*K] their rows (row = slot * K + beam)."""
    return (slots[:, None] * k + torch.arange(k, device=slots.device)).view(-1)


def write_position(buf: Tensor, new: Tensor, step: Tensor) -> None:
    """Write a step's keys or values at each row's position. buf: [N, H, L, D], new: [N, H*D], step: [N] long."""
    n, h, _, d = buf.shape
    at = step.view(n, 1, 1, 1).expand(n, h, 1, d)
    buf.scatter_(2, at, new.view(n, h, 1, d).to(buf.dtype))  # under autocast the projection may be narrower


def pad_source(x: Tensor, n_positions: int, dim: int, fill: float) -> Tensor:
    """x with its source dimension `dim` (S) padded to n_positions with `fill`: keys and values [B, H, S, D]
    (dim 2), or a bias [B, 1, 1, S] (dim 3)."""
    missing = n_positions - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_full(shape, fill)], dim=dim)
