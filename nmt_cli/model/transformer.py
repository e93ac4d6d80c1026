"""The encoder-decoder Transformer: `encode`, teacher-forced `decode`, incremental `decode_step` and
`decode_slots` (the same step over fixed slots: model/slots.py).

Shapes: B batch, K beam, N = B*K rows, S source length, T target length, D d_model, V vocab. `src_pad_mask` is
True at padding; None: no sentence is padded (no mask lets SDPA choose its fastest kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor, nn

from nmt_cli.config import ModelConfig
from nmt_cli.data.vocab import PAD
from nmt_cli.model.attention import attention_bias, attention_mask
from nmt_cli.model.cache import DecoderCache
from nmt_cli.model.layers import DecoderLayer, Dropout, EncoderLayer, sinusoidal_positions
from nmt_cli.model.linear import Linear
from nmt_cli.model.slots import SlotCache, pad_source
from nmt_cli.runtime import DROPOUT_STREAM
from nmt_cli.steps import Steps, run_to_end


@dataclass
class EncoderOut:
    memory: Tensor  # [B, S, D]
    src_pad_mask: Tensor | None  # [B, S] True at padding; None: no padding

    def select(self, rows: Tensor) -> EncoderOut:
        """The sentences `rows` [B'] (repeats allowed) of this output."""
        return EncoderOut(self.memory[rows], None if self.src_pad_mask is None else self.src_pad_mask[rows])


@dataclass
class AttentionWeights:
    """What `forward(..., weights=AttentionWeights())` records: softmax(QK^T/sqrt(Dk)), 0 where masked."""

    encoder: list[Tensor] = field(default_factory=list)  # per encoder layer [B, H, S, S]
    decoder: list[Tensor] = field(default_factory=list)  # per decoder layer, self-attention [B, H, T, T]
    cross: list[Tensor] = field(default_factory=list)  # per decoder layer, encoder-decoder [B, H, T, S]


class Embedding(nn.Module):
    """Token embedding x sqrt(D) plus positions, then dropout (paper §3.4, §3.5, §5.4)."""

    def __init__(self, tokens: nn.Embedding, max_positions: int, learned_pos: bool, dropout: float) -> None:
        super().__init__()
        self.tokens = tokens
        d_model = tokens.embedding_dim
        self.scale = math.sqrt(d_model)
        if learned_pos:
            table = torch.empty(max_positions, d_model)  # on the meta device: nothing to draw (see Transformer)
            self.positions = nn.Parameter(table if table.is_meta else torch.randn_like(table) * d_model**-0.5)
        else:
            self.register_buffer("positions", sinusoidal_positions(max_positions, d_model), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, start: int = 0) -> Tensor:
        """tokens: [N, T] -> [N, T, D], positions start..start+T-1."""
        pos = self.positions[start : start + tokens.shape[1]]
        return self.dropout(self.tokens(tokens) * self.scale + pos)

    def at(self, tokens: Tensor, position: Tensor) -> Tensor:
        """tokens: [N] -> [N, D], row i at position[i] (`position` [N], or [1] for all; on the device)."""
        return self.dropout(self.tokens(tokens) * self.scale + self.positions.index_select(0, position))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.max_positions = max_positions = cfg.max_positions
        vocab_size, d_model = cfg.vocab_size, cfg.d_model
        # Training's --checkpoint-activations: each layer's activations recomputed in the backward pass (`through`).
        self.checkpoint_activations = False
        # On the meta device there is nothing to initialise (and normal_() would cost a second of start-up).
        on_meta = torch.empty(0).is_meta

        def embedding() -> nn.Embedding:
            weight = torch.empty(vocab_size, d_model) if on_meta else None
            return nn.Embedding(vocab_size, d_model, padding_idx=PAD, _weight=weight)

        src_tokens = embedding()
        tgt_tokens = src_tokens if cfg.share_embeddings else embedding()
        for emb in {src_tokens, tgt_tokens} if not on_meta else ():
            nn.init.normal_(emb.weight, mean=0.0, std=d_model**-0.5)
            nn.init.zeros_(emb.weight[PAD])
        self.src_embed = Embedding(src_tokens, max_positions, cfg.learned_pos, cfg.dropout)
        self.tgt_embed = Embedding(tgt_tokens, max_positions, cfg.learned_pos, cfg.dropout)
        encoder, decoder = (
            (EncoderLayer(cfg) for _ in range(cfg.encoder_layers)),
            (DecoderLayer(cfg) for _ in range(cfg.decoder_layers)),
        )
        self.encoder: list[EncoderLayer] = nn.ModuleList(encoder)  # type: ignore[assignment]
        self.decoder: list[DecoderLayer] = nn.ModuleList(decoder)  # type: ignore[assignment]
        # Pre-norm stacks end with a LayerNorm; post-norm layers already end normalised.
        self.encoder_norm = nn.LayerNorm(d_model) if cfg.normalize_before else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if cfg.normalize_before else nn.Identity()
        self.output = Linear(d_model, vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
        if cfg.share_output_embed:
            self.output.weight = tgt_tokens.weight  # the pre-softmax projection (paper §3.4)

    def encode(
        self, src_tokens: Tensor, src_pad_mask: Tensor | None, weights: AttentionWeights | None = None
    ) -> EncoderOut:
        """src_tokens: [B, S] -> memory [B, S, D]. weights: records each layer's self-attention."""
        return run_to_end(self.encode_steps(src_tokens, src_pad_mask, weights))

    def encode_steps(
        self, src_tokens: Tensor, src_pad_mask: Tensor | None, weights: AttentionWeights | None = None
    ) -> Steps[EncoderOut]:
        """`encode` one layer per resumption, so that a caller can interleave other work between layers."""
        mask = attention_mask(src_pad_mask)
        x = self.src_embed(src_tokens)
        for layer in self.encoder:
            x = self.through(layer, x, mask, None if weights is None else weights.encoder)
            yield
        return EncoderOut(self.encoder_norm(x), src_pad_mask)

    def decode(self, tgt_in: Tensor, enc: EncoderOut, weights: AttentionWeights | None = None) -> Tensor:
        """Teacher-forced decoder. tgt_in: [B, T] -> hidden states [B, T, D] (project with `logits`)."""
        mask = attention_mask(enc.src_pad_mask)
        x = self.tgt_embed(tgt_in)
        records = (None, None) if weights is None else (weights.decoder, weights.cross)
        for layer in self.decoder:
            x = self.through(partial(teacher_forced, layer, records), x, enc.memory, mask)
        return self.decoder_norm(x)

    def through(self, layer: Callable[..., Tensor], *args: Tensor | list[Tensor] | None) -> Tensor:
        """layer(*args); with `checkpoint_activations` under autograd, recomputed in the backward pass, CPU
        dropout's stream (runtime.DROPOUT_STREAM) rewound for the recomputation and put back after it."""
        if not (self.checkpoint_activations and torch.is_grad_enabled()):
            return layer(*args)
        from torch.utils.checkpoint import checkpoint

        start = DROPOUT_STREAM.state
        forward_done: list[bool] = []

        def run(*inputs: Tensor | list[Tensor] | None) -> Tensor:
            if not forward_done:
                forward_done.append(True)
                return layer(*inputs)
            now, DROPOUT_STREAM.state = DROPOUT_STREAM.state, start
            try:
                return layer(*inputs)
            finally:  # also where the recomputation stops early, once it has what the backward needs
                DROPOUT_STREAM.state = now

        return checkpoint(run, *args, use_reentrant=False)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.output(hidden)  # [..., V]

    def forward(
        self, src_tokens: Tensor, src_pad_mask: Tensor | None, tgt_in: Tensor, weights: AttentionWeights | None = None
    ) -> Tensor:
        """Teacher-forced pass -> logits [B, T, V]. weights: an empty AttentionWeights to fill; the pass then
        computes them explicitly instead of through the fused kernels, and its output uses exactly those."""
        return self.logits(self.decode(tgt_in, self.encode(src_tokens, src_pad_mask, weights), weights))

    def init_cache(self, enc: EncoderOut, beam: int) -> DecoderCache:
        """Project the encoder output to every layer's cross-attention K/V once; empty self-attention state.
        Laid out once for the per-step products: V contiguous, and K on CPU stored as a contiguous K^T."""
        cpu = enc.memory.device.type == "cpu"
        cross = [
            (k.transpose(-1, -2).contiguous().transpose(-1, -2) if cpu else k.contiguous(), v.contiguous())
            for k, v in (layer.cross_attn.memory_kv(enc.memory) for layer in self.decoder)
        ]
        b, _, d = enc.memory.shape
        attn = self.decoder[0].self_attn
        empty_k = enc.memory.new_zeros(b * beam, attn.heads, 0, attn.qk_size // attn.heads)
        empty_v = enc.memory.new_zeros(b * beam, attn.heads, 0, d // attn.heads)
        n = len(self.decoder)
        return DecoderCache(
            [empty_k] * n,
            [empty_v] * n,
            [k for k, _ in cross],
            [v for _, v in cross],
            attention_bias(enc.src_pad_mask, enc.memory.dtype),
        )

    def decode_step(self, prev_tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """Advance every row one token. prev_tokens: [N] -> (log-probs [N, V] in float32, the cache advanced in
        place). The step index is the cache length; rows are sentence-major (row = b * K + beam)."""
        x = self.tgt_embed(prev_tokens[:, None], start=cache.length)[:, 0]  # [N, D]
        for i, layer in enumerate(self.decoder):
            x, cache.self_k[i], cache.self_v[i] = layer.step(
                x, cache.self_k[i], cache.self_v[i], cache.rows, cache.cross_k[i], cache.cross_v[i], cache.cross_bias
            )
        cache.rows = None
        return normalise_logits(self.logits(self.decoder_norm(x))), cache

    def init_slots(self, enc: EncoderOut, beam: int, *, n_positions: int, source_len: int) -> SlotCache:
        """A fixed-slot cache of `beam` rows per sentence: self-attention buffers of n_positions, and `init_cache`'s
        cross-attention keys and values with sources padded to source_len (>= S) so that a bucket shares shapes."""
        cache = self.init_cache(enc, 1)
        b, s, d = enc.memory.shape
        attn = self.decoder[0].self_attn
        n, h = b * beam, attn.heads
        device = enc.memory.device
        # Keys and values in the dtype the step computes them in (autocast's): no cast of the buffers each step.
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else enc.memory.dtype
        no_padding = torch.zeros(b, s, dtype=torch.bool, device=device)
        bias = attention_bias(no_padding if enc.src_pad_mask is None else enc.src_pad_mask, enc.memory.dtype)
        assert bias is not None
        return SlotCache(
            [enc.memory.new_zeros(n, h, n_positions, attn.qk_size // h, dtype=dtype) for _ in self.decoder],
            [enc.memory.new_zeros(n, h, n_positions, d // h, dtype=dtype) for _ in self.decoder],
            [pad_source(k, source_len, 2, 0.0) for k in cache.cross_k],
            [pad_source(v, source_len, 2, 0.0) for v in cache.cross_v],
            pad_source(bias, source_len, 3, float("-inf")),  # [B, 1, 1, S'], a bias even without padding
            torch.zeros(n, dtype=torch.long, device=device),
            torch.arange(n_positions, device=device),
        )

    def decode_slots(
        self, prev_tokens: Tensor, rows: Tensor | None, cache: SlotCache, window: int | None = None
    ) -> Tensor:
        """`decode_step` over fixed slots, every shape fixed (for CUDA graphs): row i first continues row rows[i]
        (None: its own), then every row advances one token attending to the first `window` positions (None: all).
        prev_tokens: [N] -> log-probs [N, V] in float32."""
        window = cache.n_positions if window is None else window
        if rows is not None:
            cache.reorder(rows, window)
        x = self.tgt_embed.at(prev_tokens, cache.step)  # [N, D]
        bias = cache.self_bias(window)
        for i, layer in enumerate(self.decoder):
            self_attend = partial(
                layer.self_attn.step_slots,
                buf_k=cache.self_k[i][:, :, :window],
                buf_v=cache.self_v[i][:, :, :window],
                step=cache.step,
                bias=bias,
            )
            x = layer.step_slots(x, self_attend, cache.cross_k[i], cache.cross_v[i], cache.cross_bias)
        cache.step.add_(1)
        return normalise_logits(self.logits(self.decoder_norm(x)))


def teacher_forced(
    layer: DecoderLayer,
    records: tuple[list[Tensor] | None, list[Tensor] | None],
    x: Tensor,
    memory: Tensor,
    mask: Tensor | None,
) -> Tensor:
    """A decoder layer's teacher-forced pass, with its cross-attention keys and values projected from `memory`."""
    return layer(x, *layer.cross_attn.memory_kv(memory), mask, *records)


def normalise_logits(logits: Tensor) -> Tensor:
    """log_softmax of fresh logits [N, V] (the caller's own tensor) in float32; on CPU in place, sparing the [N, V]
    allocation, except in grad mode, where autograd refuses out= arguments."""
    logits = logits.float()
    in_place = logits.device.type == "cpu" and not torch.is_grad_enabled()
    return torch.log_softmax(logits, -1, out=logits if in_place else None)


def build_model(cfg: ModelConfig) -> Transformer:
    return Transformer(cfg)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
