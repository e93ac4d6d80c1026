"""The decoder's incremental state, passed into and returned from `Transformer.decode_step`.

Shapes: B sentences, K beams, N = B*K rows (row = sentence * K + beam), H heads, t steps so far,
S source length, Dk key size and Dh value size per head.

Following the surviving beams (`select_rows`) only records which old row each new row continues;
the next `decode_step` applies it while appending the step's keys and values (`append_step`): one
copy of the self-attention state per step instead of two, and each layer's old state is freed as
soon as its new one exists, so beam search holds the state about once, not twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class DecoderCache:
    self_k: list[Tensor]  # per decoder layer [N', H, t, Dk], grows one step per call
    self_v: list[Tensor]  # per decoder layer [N', H, t, Dh]
    cross_k: list[Tensor]  # per decoder layer [B, H, S, Dk], computed once from the encoder output
    cross_v: list[Tensor]  # per decoder layer [B, H, S, Dh]
    cross_bias: Tensor | None  # [B, 1, 1, S] added to cross-attention scores: 0, -inf at padding; None: no padding
    rows: Tensor | None = None  # [N] pending reorder: row i continues stored row rows[i]; None: N' = N, in order

    @property
    def n_sentences(self) -> int:
        return self.cross_k[0].shape[0]

    @property
    def length(self) -> int:
        """Steps decoded so far (the position of the next token)."""
        return self.self_k[0].shape[2]

    def select_rows(self, rows: Tensor) -> DecoderCache:
        """Follow the surviving beams. rows: [N] indices into the current N rows (applied by the next step)."""
        return DecoderCache(
            self.self_k, self.self_v, self.cross_k, self.cross_v, self.cross_bias, self._continued(rows)
        )

    def select_sentences(self, sentences: Tensor, rows: Tensor) -> DecoderCache:
        """Keep only some sentences (those still searching). sentences: [B'], rows: [B'*K] into the N rows."""
        return DecoderCache(
            self.self_k,
            self.self_v,
            [k[sentences] for k in self.cross_k],  # indexing keeps their memory layout (init_cache)
            [v[sentences] for v in self.cross_v],
            None if self.cross_bias is None else self.cross_bias.index_select(0, sentences),
            self._continued(rows),
        )

    def _continued(self, rows: Tensor) -> Tensor:
        """The stored rows that `rows` (indices into the current rows) continue, through any pending reorder."""
        return rows if self.rows is None else self.rows.index_select(0, rows)


def append_step(past: Tensor, new: Tensor, rows: Tensor | None) -> Tensor:
    """torch.cat([past[rows], new], dim=2) written with one copy.
    past: [N', H, t, D], new: [N, H*D] (a view of the step's projection) -> [N, H, t+1, D]."""
    n, h, t, d = new.shape[0], past.shape[1], past.shape[2], past.shape[3]
    out = past.new_empty(n, h, t + 1, d)
    if rows is None:
        out[:, :, :t] = past
    else:
        torch.index_select(past, 0, rows, out=out[:, :, :t])
    out[:, :, t] = new.view(n, h, d)
    return out
