"""The decoder's incremental state, passed into and returned from `Transformer.decode_step`.

Shapes: B sentences, K beams, N = B*K rows (row = sentence * K + beam), H heads, t steps so far,
S source length, Dk key size and Dh value size per head.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class DecoderCache:
    self_k: list[Tensor]  # per decoder layer [N, H, t, Dk], grows one step per call
    self_v: list[Tensor]  # per decoder layer [N, H, t, Dh]
    cross_k: list[Tensor]  # per decoder layer [B, H, S, Dk], computed once from the encoder output
    cross_v: list[Tensor]  # per decoder layer [B, H, S, Dh]
    cross_mask: Tensor | None  # [B, 1, 1, S] True where a source position may be attended; None: no padding

    @property
    def n_sentences(self) -> int:
        return self.cross_k[0].shape[0]

    def select_rows(self, rows: Tensor) -> DecoderCache:
        """Reorder the self-attention state to follow the surviving beams. rows: [N] indices into N."""
        return DecoderCache(
            [k.index_select(0, rows) for k in self.self_k],
            [v.index_select(0, rows) for v in self.self_v],
            self.cross_k,
            self.cross_v,
            self.cross_mask,
        )

    def select_sentences(self, sentences: Tensor, rows: Tensor) -> DecoderCache:
        """Keep only some sentences (those still searching). sentences: [B'], rows: [B'*K]."""
        return DecoderCache(
            [k.index_select(0, rows) for k in self.self_k],
            [v.index_select(0, rows) for v in self.self_v],
            [k.index_select(0, sentences) for k in self.cross_k],
            [v.index_select(0, sentences) for v in self.cross_v],
            None if self.cross_mask is None else self.cross_mask.index_select(0, sentences),
        )
