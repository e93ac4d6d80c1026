"""Multi-head scaled dot-product attention (paper §3.2) on top of F.scaled_dot_product_attention.

Shapes: B batch, K beam, N rows (B or B*K), S source length, T target length, D d_model, H heads, Dk key size per
head (D / H unless `key_dim` is given: Table 3 row B), Dh = D / H value size per head. Masks are True where attention
is *allowed*, as SDPA takes them (`attention_mask()`), or float scores to add (`attention_bias()`). A `record` list
makes a forward compute the weights explicitly, use them and append them ([N, H, Tq, Tk])."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.model.cache import append_step
from nmt_cli.model.linear import Linear, padded_rows, pads_rows
from nmt_cli.model.slots import write_position


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False, dropout: float = 0.0
) -> Tensor:
    """Scaled dot-product attention -> [N, H, Tq, Dh]. On CPU written out (`attend_explicit`), faster than SDPA's
    CPU kernels on NMT's short sequences (`benchmarks/profile_step.py`, `profile_generate.py`); elsewhere SDPA."""
    if q.device.type == "cpu":
        return attend_explicit(q, k, v, mask, causal, dropout)[0]
    if mask is not None and mask.is_floating_point():  # an attention_bias: SDPA's fused kernels want q's dtype
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)


def attention_mask(src_pad_mask: Tensor | None) -> Tensor | None:
    """[B, S] True at padding -> [B, 1, 1, S] True where a key may be attended; None (no padding) stays None."""
    return None if src_pad_mask is None else ~src_pad_mask[:, None, None, :]


def attention_bias(src_pad_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """[B, S] True at padding -> [B, 1, 1, S] scores to add (0, or -inf at padding); None stays None. Per decoding
    step an add costs less than a boolean mask's select (`benchmarks/profile_generate.py`)."""
    if src_pad_mask is None:
        return None
    b, s = src_pad_mask.shape
    bias = torch.zeros(b, 1, 1, s, dtype=dtype, device=src_pad_mask.device)
    return bias.masked_fill_(src_pad_mask[:, None, None, :], float("-inf"))


def attend_explicit(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False, dropout: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(Dk)) v written out -> (output [N, H, Tq, Dh], weights [N, H, Tq, Tk]). Masked positions
    weigh exactly 0; dropout applies to the weights used, not to those returned."""
    scores = (q @ k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)  # in place: the product saves its inputs only
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores.add_(mask)
    if causal:
        future = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    weights = scores.softmax(dim=-1)  # on CPU, bfloat16 softmax accumulates in float32
    used = F.dropout(weights, dropout) if dropout else weights
    return used @ v, weights


def split_heads(x: Tensor, heads: int) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, heads, d // heads).transpose(1, 2)  # [B, H, T, Dh]


def merge_heads(x: Tensor) -> Tensor:
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)  # [B, T, D]


def project_out(out: nn.Module, y: Tensor) -> Tensor:
    """out(merge_heads(y)) -> [N, T, D], on the CPU training route merged straight into padded rows (one copy)."""
    if not pads_rows(out, y):
        return out(merge_heads(y))
    b, h, t, dh = y.shape
    rows = b * t
    merged = y.new_empty(padded_rows(rows), h * dh)
    merged[:rows].view(b, t, h, dh).copy_(y.transpose(1, 2))
    merged[rows:] = 0
    return out(merged)[:rows].view(b, t, -1)


class SelfAttention(nn.Module):
    """Self-attention with one fused QKV projection; the decoder's incremental step extends a K/V cache."""

    def __init__(self, d_model: int, heads: int, dropout: float, key_dim: int = 0) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qk_size = heads * (key_dim or d_model // heads)  # H * Dk (sizes kept here: PackedLinear has none)
        self.v_size = d_model
        self.qkv = Linear(d_model, 2 * self.qk_size + d_model)
        self.out = Linear(d_model, d_model)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.qkv(x).split([self.qk_size, self.qk_size, self.v_size], dim=-1)  # [N, T, H*Dk] x2, [N, T, D]
        return split_heads(q, self.heads), split_heads(k, self.heads), split_heads(v, self.heads)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, causal: bool = False, record: list[Tensor] | None = None
    ) -> Tensor:
        """x: [N, T, D]; mask: [N, 1, 1, T] or None; causal: future positions hidden; record: see module doc."""
        q, k, v = self.project_qkv(x)
        dropout = self.dropout if self.training else 0.0
        if record is None:
            y = attend(q, k, v, mask, causal, dropout)
        else:
            y, weights = attend_explicit(q, k, v, mask, causal, dropout)
            record.append(weights)
        return project_out(self.out, y)

    def step(
        self, x: Tensor, past_k: Tensor, past_v: Tensor, rows: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One decoding step. x: [N, D]; past_k: [N', H, t, Dk], past_v: [N', H, t, Dh]; rows: [N] the past
        row each row continues (None: the same one) -> (y [N, D], k [N, H, t+1, Dk], v [N, H, t+1, Dh]).
        Rows stay two-dimensional and the heads are views: on CPU each tensor call costs microseconds."""
        n, qk = x.shape[0], self.qk_size
        qkv = self.qkv(x)  # [N, 2 * H*Dk + D]
        k = append_step(past_k, qkv[:, qk : 2 * qk], rows)
        v = append_step(past_v, qkv[:, 2 * qk :], rows)
        y = attend(qkv[:, :qk].view(n, self.heads, 1, -1), k, v)  # [N, H, 1, Dh]
        return self.out(y.reshape(n, -1)), k, v  # a view, whichever layout SDPA returned its one query in

    def step_slots(self, x: Tensor, buf_k: Tensor, buf_v: Tensor, step: Tensor, bias: Tensor) -> Tensor:
        """One decoding step over fixed slots. x: [N, D] -> [N, D]; buf_k [N, H, L, Dk] and buf_v [N, H, L, Dh]
        written in place at each row's `step` ([N]); `bias` [N, 1, 1, L] masks the positions not yet written."""
        n, qk = x.shape[0], self.qk_size
        qkv = self.qkv(x)  # [N, 2 * H*Dk + D]
        write_position(buf_k, qkv[:, qk : 2 * qk], step)
        write_position(buf_v, qkv[:, 2 * qk :], step)
        y = attend(qkv[:, :qk].view(n, self.heads, 1, -1), buf_k, buf_v, bias)  # [N, H, 1, Dh]
        return self.out(y.reshape(n, -1))


class CrossAttention(nn.Module):
    """Encoder-decoder attention. Keys and values are projected once per sentence (`memory_kv`)."""

    def __init__(self, d_model: int, heads: int, dropout: float, key_dim: int = 0) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qk_size = heads * (key_dim or d_model // heads)  # H * Dk (sizes kept here: PackedLinear has none)
        self.v_size = d_model
        self.q = Linear(d_model, self.qk_size)
        self.kv = Linear(d_model, self.qk_size + d_model)
        self.out = Linear(d_model, d_model)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory: [B, S, D] -> k: [B, H, S, Dk], v: [B, H, S, Dh]."""
        k, v = self.kv(memory).split([self.qk_size, self.v_size], dim=-1)
        return split_heads(k, self.heads), split_heads(v, self.heads)

    def forward(
        self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, record: list[Tensor] | None = None
    ) -> Tensor:
        """x: [B, Tq, D] queries; k: [B, H, S, Dk]; v: [B, H, S, Dh]; mask: [B, 1, 1, S] or None -> [B, Tq, D]."""
        q = split_heads(self.q(x), self.heads)
        if record is not None:
            y, weights = attend_explicit(q, k, v, mask, dropout=self.dropout if self.training else 0.0)
            record.append(weights)
        else:
            y = attend(q, k, v, mask, dropout=self.dropout if self.training else 0.0)
        return project_out(self.out, y)

    def step(self, x: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        """One decoding step. x: [N, D], N = B*K rows, sentence-major; k: [B, H, S, Dk]; v: [B, H, S, Dh]; bias:
        [B, 1, 1, S] or None -> [N, D]. A sentence's K beams are its K queries: its keys and values are not copied."""
        n, b = x.shape[0], k.shape[0]
        q = self.q(x).view(b, n // b, self.heads, -1).transpose(1, 2)  # [B, H, K, Dk]
        return self.out(attend(q, k, v, bias).transpose(1, 2).reshape(n, -1))
