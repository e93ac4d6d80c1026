"""Encoder and decoder layers, the position-wise feed-forward network, and positional encodings.

Shapes: B batch, N rows (B or B*K beams), S source length, T target length, D d_model.
Every sub-layer is wrapped as LayerNorm(x + Dropout(f(x))) (post-norm, paper §3.1 and §5.4), or
x + Dropout(f(LayerNorm(x))) with normalize_before (pre-norm).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.config import ModelConfig
from nmt_cli.model.attention import CrossAttention, SelfAttention
from nmt_cli.model.linear import Linear, pad_rows, pads_rows
from nmt_cli.runtime import random_int16


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...) (paper §3.5). -> [P, D]"""
    cpu = torch.device("cpu")  # also when the model is built on the meta device: the table is not a weight
    pos = torch.arange(n_positions, dtype=torch.float64, device=cpu)[:, None]
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64, device=cpu) / d_model)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64, device=cpu)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq[: d_model // 2])
    return pe.float()


class Dropout(nn.Module):
    """Inverted dropout. On CPU the mask comes from the dropout stream's 16-bit numbers (runtime.random_int16),
    several times cheaper than torch.rand_like: p is rounded to a multiple of 2^-16 (0.1 -> 0.100006) and kept
    units scaled by the exact inverse of the keep probability. Elsewhere (CUDA, torch.compile) PyTorch's own."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or torch.compiler.is_compiling():
            return F.dropout(x, self.p, training=True)
        dropped = min(round(self.p * 65536), 65535)  # of 65536 equally likely int16 values
        keep = torch.from_numpy(random_int16(x.numel())).view(x.shape) >= dropped - 32768
        # A product with the boolean mask: half the time of masked_fill on CPU, forward and backward.
        return (x * keep).mul_(65536 / (65536 - dropped))


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (paper §3.3)."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float) -> None:
        super().__init__()
        self.fc1 = Linear(d_model, d_ff)
        self.fc2 = Linear(d_ff, d_model)
        self.dropout = Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        if not pads_rows(self.fc1, x):
            return self.fc2(self.dropout(self.fc1.forward_relu(x)))  # also a PackedLinear or Int8Linear
        # Padded once here (model/linear.py), so fc2 saves the ReLU's own output, not a padded copy of it.
        rows = x.shape[:-1].numel()
        y = self.fc2(self.dropout(self.fc1.forward_relu(pad_rows(x.reshape(rows, x.shape[-1])))))
        return y[:rows].view(*x.shape[:-1], y.shape[-1])


class Residual(nn.Module):
    """A sub-layer's residual connection, dropout and LayerNorm, post-norm or pre-norm."""

    def __init__(self, d_model: int, dropout: float, normalize_before: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.normalize_before = normalize_before

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.normalize_before:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))

    def step(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """forward() for inference (no dropout), the residual summed into the sub-layer's fresh output in place where
        both have one dtype and grad mode is off (autograd forbids writing into the CPU route's output views)."""
        y = sublayer(self.norm(x) if self.normalize_before else x)
        y = y.add_(x) if y.dtype == x.dtype and not torch.is_grad_enabled() else x + y
        return y if self.normalize_before else self.norm(y)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention_key_dim)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.res_attn = Residual(cfg.d_model, cfg.dropout, cfg.normalize_before)
        self.res_ffn = Residual(cfg.d_model, cfg.dropout, cfg.normalize_before)

    def forward(self, x: Tensor, mask: Tensor | None, record: list[Tensor] | None = None) -> Tensor:
        """x: [B, S, D]; mask: [B, 1, 1, S] True where attention is allowed; record: gets the weights [B, H, S, S]."""
        x = self.res_attn(x, lambda h: self.self_attn(h, mask, record=record))
        return self.res_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = SelfAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention_key_dim)
        self.cross_attn = CrossAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.attention_key_dim)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.res_self, self.res_cross, self.res_ffn = (
            Residual(cfg.d_model, cfg.dropout, cfg.normalize_before) for _ in range(3)
        )

    def forward(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        cross_mask: Tensor | None,
        self_record: list[Tensor] | None = None,
        cross_record: list[Tensor] | None = None,
    ) -> Tensor:
        """Teacher-forced pass. x: [B, T, D]; cross_k/v: [B, H, S, Dk/Dh]; cross_mask: [B, 1, 1, S].
        self_record, cross_record: get the weights [B, H, T, T] and [B, H, T, S] (see attention.py)."""
        x = self.res_self(x, lambda h: self.self_attn(h, causal=True, record=self_record))
        x = self.res_cross(x, lambda h: self.cross_attn(h, cross_k, cross_v, cross_mask, record=cross_record))
        return self.res_ffn(x, self.ffn)

    def step(
        self,
        x: Tensor,
        past_k: Tensor,
        past_v: Tensor,
        rows: Tensor | None,
        cross_k: Tensor,
        cross_v: Tensor,
        cross_bias: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One incremental step (inference only). x: [N, D] with N = B*K; rows: pending beam reorder of past_k/v
        (cache.py); cross_bias: [B, 1, 1, S] -> (x [N, D], k, v [N, H, t+1, Dh])."""
        new_kv: list[Tensor] = []

        def self_attend(h: Tensor) -> Tensor:
            y, k, v = self.self_attn.step(h, past_k, past_v, rows)
            new_kv.extend((k, v))
            return y

        x = self.res_self.step(x, self_attend)
        x = self.res_cross.step(x, lambda h: self.cross_attn.step(h, cross_k, cross_v, cross_bias))
        return self.res_ffn.step(x, self.ffn), new_kv[0], new_kv[1]

    def step_slots(
        self,
        x: Tensor,
        self_attend: Callable[[Tensor], Tensor],
        cross_k: Tensor,
        cross_v: Tensor,
        cross_bias: Tensor | None,
    ) -> Tensor:
        """`step` over fixed slots: `self_attend` [N, D] -> [N, D] attends over the layer's own slot buffers."""
        x = self.res_self.step(x, self_attend)
        x = self.res_cross.step(x, lambda h: self.cross_attn.step(h, cross_k, cross_v, cross_bias))
        return self.res_ffn.step(x, self.ffn)
