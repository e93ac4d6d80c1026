"""The decoder's state over fixed slots: every row keeps its place for a whole batch, and each layer's
self-attention keys and values live in buffers preallocated to the batch's longest output, written in place at
the step's position (`Transformer.decode_slots`).

Shapes: B sentences, K beams, N = B*K rows (row = sentence * K + beam), H heads, L preallocated positions,
S source length, Dk key size and Dh value size per head.

No tensor of a step changes shape or address between steps: the step index is a device tensor, beams are
reordered by copying within the same buffers, and the positions not yet written are masked. That is what lets a
step be captured once as a CUDA graph and replayed. A caller that runs the step eagerly passes a `window`, the
positions written so far: the step attends to those alone (no mask) and reorders only them, in one copy into
spare buffers that then swap places with the buffers.
"""

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
    step: Tensor  # [1] long: the position the next step writes
    positions: Tensor  # [L] long, 0..L-1: compared with `step` for the mask of positions not yet written
    spare_k: list[Tensor] | None = None  # eager steps' reorder target, as self_k (made by the first one)
    spare_v: list[Tensor] | None = None

    @property
    def n_positions(self) -> int:
        """L, the positions preallocated."""
        return self.self_k[0].shape[2]

    def reorder(self, rows: Tensor, window: int | None) -> None:
        """Row i continues row rows[i] [N]: each layer's keys and values reordered.

        window None (a step to capture): all L positions, copied within their own buffers, which keep their
        addresses (two copies). A window (an eager step): its first positions, gathered in one copy into spare
        buffers, which then take the buffers' place."""
        if window is None:
            for buf in (*self.self_k, *self.self_v):
                buf.copy_(buf.index_select(0, rows))
            return
        if self.spare_k is None or self.spare_v is None:
            self.spare_k, self.spare_v = (
                [b.new_empty(b.shape) for b in self.self_k],
                [b.new_empty(b.shape) for b in self.self_v],
            )
        for buffers, spares in ((self.self_k, self.spare_k), (self.self_v, self.spare_v)):
            for i, (buf, spare) in enumerate(zip(buffers, spares)):
                torch.index_select(buf[:, :, :window], 0, rows, out=spare[:, :, :window])
                buffers[i], spares[i] = spare, buf

    def self_bias(self, window: int | None) -> Tensor | None:
        """[1, 1, 1, L] scores to add over all L positions: 0 up to the step's own, -inf beyond (not yet written);
        None with a window, whose positions are all written."""
        if window is not None:
            return None
        zero = self.step.new_zeros((), dtype=self.self_k[0].dtype)
        return torch.where(self.positions > self.step, NEG_INF, zero)[None, None, None, :]

    def load(self, other: SlotCache) -> None:
        """Take `other`'s batch (its cross-attention keys, values and bias) into these buffers and start again at
        step 0: the buffers keep their addresses, so a step captured over them replays for the new batch.
        `other` must have this cache's shapes (the same bucket)."""
        for mine, theirs in zip([*self.cross_k, *self.cross_v], [*other.cross_k, *other.cross_v]):
            assert mine.shape == theirs.shape, "a batch is loaded only into a cache of its own shapes"
            mine.copy_(theirs)
        assert (self.cross_bias is None) == (other.cross_bias is None), "both caches pad their sources, or neither"
        if self.cross_bias is not None and other.cross_bias is not None:
            self.cross_bias.copy_(other.cross_bias)
        self.restart()

    def restart(self) -> None:
        """Start the batch again at step 0 (what is written beyond is masked until written again)."""
        self.step.zero_()


def write_position(buf: Tensor, new: Tensor, step: Tensor) -> None:
    """Write a step's keys or values at position `step`. buf: [N, H, L, D], new: [N, H*D], step: [1] long."""
    n, h, _, d = buf.shape
    buf.index_copy_(2, step, new.view(n, h, 1, d).to(buf.dtype))  # under autocast the projection may be narrower


def pad_source(x: Tensor, n_positions: int, dim: int, fill: float) -> Tensor:
    """x with its source dimension `dim` (S) padded to n_positions with `fill`: keys and values [B, H, S, D]
    (dim 2), or a bias [B, 1, 1, S] (dim 3)."""
    missing = n_positions - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_full(shape, fill)], dim=dim)
