"""An `nmt` checkpoint as a CTranslate2 Transformer, through CTranslate2's own spec and Converter classes.

What the mapping has to respect (each checked by tests/export/test_ctranslate2.py's parity test):
- post-norm (`pre_norm=False`) or pre-norm with a final LayerNorm, as the checkpoint says;
- fused QKV (`self_attention.linear[0]`, rows q, k, v) and fused cross-attention KV (`attention.linear[1]`);
- token embeddings scaled by sqrt(d_model); positions added from *our* table (sin at even, cos at odd
  dimensions, or the learned one), written out with all `max_positions` rows, because CTranslate2's
  built-in sinusoids put all sines first and all cosines after;
- one vocabulary listing every embedding row: the sentencepiece pieces with our special ids
  (pad 0, unk 1, bos 2, eos 3), then a unique dummy name for each padding row;
- decoding starts from BOS `<s>` (fairseq starts from EOS; nmt does not) and sources end with EOS.
Every tensor of the checkpoint must find a place; one that does not is a one-line ExportError naming it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np
import torch
from ctranslate2.specs import attention_spec, common_spec, transformer_spec

from nmt_cli.checkpoint.saved import read_saved_model
from nmt_cli.config import ModelConfig
from nmt_cli.data.vocab import BOS, EOS, UNK, Vocab
from nmt_cli.errors import ExportError
from nmt_cli.model.transformer import Transformer

SPM_FILE = "sentencepiece.model"
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which nmt uses everywhere


class Weights:
    """The checkpoint's tensors as float32 numpy arrays, taken by name; remembers which were used."""

    def __init__(self, model: Transformer) -> None:
        self.tensors = {name: t.detach().float().numpy() for name, t in model.state_dict().items()}
        self.used: set[str] = set()

    def take(self, name: str) -> np.ndarray:
        self.used.add(name)
        return self.tensors[name]

    def unused(self) -> list[str]:
        return sorted(set(self.tensors) - self.used)


def check_exportable(cfg: ModelConfig) -> None:
    """Settings CTranslate2's Transformer cannot express are refused here, by name."""
    if cfg.max_positions < 2:
        raise ExportError(f"max_positions={cfg.max_positions}: CTranslate2 needs a position table of at least 2 rows")
    if cfg.attention_key_dim and cfg.attention_key_dim != cfg.d_model // cfg.heads:
        raise ExportError(
            f"attention_key_dim={cfg.attention_key_dim} (Table 3 row B): CTranslate2's attention needs keys of "
            f"d_model / heads = {cfg.d_model // cfg.heads} per head (such a model exported, then failed to translate)"
        )


def set_linear(spec: common_spec.LinearSpec, w: Weights, prefix: str) -> None:
    spec.weight = w.take(f"{prefix}.weight")
    if f"{prefix}.bias" in w.tensors:
        spec.bias = w.take(f"{prefix}.bias")


def set_layer_norm(spec: common_spec.LayerNormSpec, w: Weights, prefix: str) -> None:
    spec.gamma = w.take(f"{prefix}.weight")
    spec.beta = w.take(f"{prefix}.bias")


def set_ffn(spec: transformer_spec.FeedForwardSpec, w: Weights, prefix: str, residual: str) -> None:
    set_layer_norm(spec.layer_norm, w, f"{prefix}.{residual}.norm")
    set_linear(spec.linear_0, w, f"{prefix}.ffn.fc1")
    set_linear(spec.linear_1, w, f"{prefix}.ffn.fc2")


def set_self_attention(spec: attention_spec.MultiHeadAttentionSpec, w: Weights, prefix: str, residual: str) -> None:
    set_linear(spec.linear[0], w, f"{prefix}.self_attn.qkv")  # rows q, k, v: CTranslate2's fused order
    set_linear(spec.linear[1], w, f"{prefix}.self_attn.out")
    set_layer_norm(spec.layer_norm, w, f"{prefix}.{residual}.norm")


def set_cross_attention(spec: attention_spec.MultiHeadAttentionSpec, w: Weights, prefix: str) -> None:
    set_linear(spec.linear[0], w, f"{prefix}.cross_attn.q")
    set_linear(spec.linear[1], w, f"{prefix}.cross_attn.kv")  # rows k, v: fused as CTranslate2 expects
    set_linear(spec.linear[2], w, f"{prefix}.cross_attn.out")
    set_layer_norm(spec.layer_norm, w, f"{prefix}.res_cross.norm")


def position_table(model: Transformer, w: Weights, side: str) -> np.ndarray:
    """[max_positions, D]: the learned table (a parameter) or our interleaved sinusoids (a buffer)."""
    name = f"{side}_embed.positions"
    if name in w.tensors:
        return w.take(name)
    return getattr(model, f"{side}_embed").positions.float().numpy()


def set_embeddings(spec: Any, model: Transformer, w: Weights, side: str) -> None:
    emb = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    emb.weight = w.take(f"{side}_embed.tokens.weight")
    spec.scale_embeddings = math.sqrt(model.src_embed.tokens.embedding_dim)
    spec.position_encodings.encodings = position_table(model, w, side)


def build_spec(
    model: Transformer, cfg: ModelConfig, vocab: list[str], specials: dict[str, str]
) -> transformer_spec.TransformerSpec:
    """The filled TransformerSpec. Raises ExportError for a tensor without a place in it."""
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.heads,
        pre_norm=cfg.normalize_before,
        activation=common_spec.Activation.RELU,
    )
    w = Weights(model)
    set_embeddings(spec.encoder, model, w, "src")
    set_embeddings(spec.decoder, model, w, "tgt")
    for i, layer in enumerate(spec.encoder.layer):
        set_self_attention(layer.self_attention, w, f"encoder.{i}", "res_attn")
        set_ffn(layer.ffn, w, f"encoder.{i}", "res_ffn")
    for i, layer in enumerate(spec.decoder.layer):
        set_self_attention(layer.self_attention, w, f"decoder.{i}", "res_self")
        set_cross_attention(layer.attention, w, f"decoder.{i}")
        set_ffn(layer.ffn, w, f"decoder.{i}", "res_ffn")
    if cfg.normalize_before:  # pre-norm stacks end with a LayerNorm, as CTranslate2's pre_norm does
        set_layer_norm(spec.encoder.layer_norm, w, "encoder_norm")
        set_layer_norm(spec.decoder.layer_norm, w, "decoder_norm")
    set_linear(spec.decoder.projection, w, "output")
    if w.unused():
        raise ExportError(
            f"the checkpoint has parameters CTranslate2's Transformer has no place for: {', '.join(w.unused()[:3])}"
        )
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.config.unk_token, spec.config.bos_token = specials["unk"], specials["bos"]
    spec.config.eos_token, spec.config.decoder_start_token = specials["eos"], specials["bos"]
    spec.config.add_source_bos, spec.config.add_source_eos = False, True
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    return spec


def vocabulary(vocab: Vocab, n_rows: int) -> list[str]:
    """One token per embedding row: the pieces, then unique names for the padding rows."""
    pieces = [vocab.sp.id_to_piece(i) for i in range(vocab.n_pieces)]
    return pieces + [f"<nmt_padding_row_{i}>" for i in range(len(pieces), n_rows)]


class NmtConverter(ctranslate2.converters.Converter):
    """CTranslate2's converter interface (`convert()` validates, quantizes and saves what `_load` returns)."""

    def __init__(self, checkpoint_path: Path) -> None:
        self.checkpoint_path = checkpoint_path
        self.spm_model = b""  # the checkpoint's sentencepiece model, kept by _load

    def _load(self) -> transformer_spec.TransformerSpec:
        saved = read_saved_model(self.checkpoint_path)
        if saved.is_parser:
            raise ExportError(
                f"{self.checkpoint_path} is a parsing model: its trees come from `nmt generate --input`, which "
                "keeps the brackets balanced and puts the words back at the leaves; CTranslate2 would give the "
                "raw linearized pieces"
            )
        cfg = saved.config
        check_exportable(cfg)
        self.spm_model = saved.vocab.model_bytes
        tokens = vocabulary(saved.vocab, cfg.vocab_size)
        specials = {"unk": tokens[UNK], "bos": tokens[BOS], "eos": tokens[EOS]}
        with torch.no_grad():
            return build_spec(saved.model(), cfg, tokens, specials)


def convert(checkpoint_path: Path, output_dir: Path, quantization: str | None) -> None:
    """Write the CTranslate2 model directory, with the checkpoint's sentencepiece model beside it."""
    converter = NmtConverter(checkpoint_path)
    converter.convert(str(output_dir), quantization=quantization, force=True)
    (output_dir / SPM_FILE).write_bytes(converter.spm_model)
