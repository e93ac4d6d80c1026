"""Attention maps of one sentence, as the paper's figures 3-5 draw them: the sentence is translated greedily (a
parser's tree under the tree constraint) and the translation teacher-forced through `Transformer.forward` with an
`AttentionWeights` recorder, so every weight drawn is one the model used. Decoder query rows are labelled with the
piece that position predicts, key columns with the piece at that position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nmt_cli.checkpoint.saved import read_saved_model
from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import BOS, EOS, Vocab
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.model.transformer import AttentionWeights, EncoderOut, Transformer
from nmt_cli.parsing.linearize import COPY_MODES
from nmt_cli.parsing.parser import TreeParser, ptb_words
from nmt_cli.plot import check_output, pyplot, save_figure
from nmt_cli.search.beam import max_lengths
from nmt_cli.search.greedy import greedy_search
from nmt_cli.search.translate import Translator

logger = logging.getLogger(__name__)

KINDS = ("encoder", "decoder", "cross")
TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "encoder-decoder attention",
}


@dataclass
class SentenceAttention:
    """One sentence's pieces and every layer's attention weights (batch dimension dropped)."""

    src_pieces: list[str]  # S: the source pieces and </s>
    tgt_in_pieces: list[str]  # T: <s> and the translation's pieces (decoder inputs, the key axis)
    tgt_out_pieces: list[str]  # T: the translation's pieces and </s> (what each decoder position predicts)
    weights: dict[str, list[Tensor]]  # kind -> per layer [H, Tq, Tk], float32

    def keys_and_queries(self, kind: str) -> tuple[list[str], list[str]]:
        if kind == "encoder":
            return self.src_pieces, self.src_pieces
        return (self.tgt_in_pieces if kind == "decoder" else self.src_pieces), self.tgt_out_pieces


def names_a_file(text: str) -> bool:
    try:
        return bool(text) and Path(text).is_file()
    except OSError:  # a sentence longer than a file name may be
        return False


@torch.inference_mode()
def sentence_attention(checkpoint_path: Path, sentence: str) -> SentenceAttention:
    """Translate `sentence` greedily with the checkpoint, then record attention on that translation."""
    sentence = sentence.strip()
    if names_a_file(sentence):  # generate's --input habit: a file
        raise DataError(
            f"--input {sentence} names a file, and plot attention draws the sentence given as text; "
            'give one of its lines, e.g. --input "$(head -1 FILE)"'
        )
    saved = read_saved_model(checkpoint_path)
    model, vocab = saved.model(), saved.vocab
    # a parser reads the words as the treebank writes them, as `nmt generate` parses (parsing/parser.py)
    words = ptb_words(sentence) if saved.is_parser else None
    src_ids = vocab.encode([sentence if words is None else " ".join(words)])[0]
    if not src_ids:
        raise DataError("--input is empty; give a sentence to translate")
    limit = model.max_positions - 1
    if len(src_ids) > limit:  # as generate does
        logger.warning("--input has %d pieces, more than the model's %d positions; cut to them", len(src_ids), limit)
        src_ids = src_ids[:limit]
    src = torch.tensor([src_ids + [EOS]])
    src_pad = torch.zeros_like(src, dtype=torch.bool)
    cfg = replace(saved.search, beam=1, sampling=False, nbest=1)
    tokens = greedy_output(model, vocab, src, model.encode(src, src_pad), cfg, words, saved.tree_leaves)
    weights = AttentionWeights()
    model(src, src_pad, torch.tensor([[BOS] + tokens]), weights)
    if words is None:
        logger.info("translation (greedy): %s", vocab.decode(tokens))
    else:
        logger.info("tree (greedy): %s", " ".join(vocab.pieces(tokens)))
    return SentenceAttention(
        vocab.pieces(src_ids) + ["</s>"],
        ["<s>"] + vocab.pieces(tokens),
        vocab.pieces(tokens) + ["</s>"],
        {kind: [w[0].float() for w in getattr(weights, kind)] for kind in KINDS},
    )


def greedy_output(
    model: Transformer,
    vocab: Vocab,
    src: Tensor,
    enc: EncoderOut,
    cfg: SearchConfig,
    words: list[str] | None,
    leaves: str | None = None,
) -> list[int]:
    """The greedy translation's ids of one sentence src [1, S] (EOS included); for a parser (`words` given, its
    --tree-leaves `leaves`), the greedy tree of exactly those words under the tree constraint generate searches
    with: unconstrained, a parser runs on to the length limit (input length + 300, a picture of thousands of rows)."""
    src_lens = torch.tensor([src.shape[1] - 1])
    if words is None:
        return greedy_search(model, enc, src_lens, cfg)[0][0].tokens
    need = len(words) + 2 + (int(src_lens[0]) if leaves in COPY_MODES else 0)  # a words tree also spells the pieces
    if int(max_lengths(src_lens, cfg, model.max_positions)[0]) < need:
        raise DataError(
            f"--input has {len(words)} words: no tree of them fits the checkpoint's length limit; give a shorter "
            "sentence"
        )
    translator = Translator(model, vocab, src.device)
    rules = TreeParser.of(translator, leaves).constraints([len(words)]).for_batch(src, src_lens, np.arange(1))
    hyps = greedy_search(model, enc, src_lens, cfg, None, vocab.n_pieces, rules=rules)
    return hyps[0][0].tokens


def attention_figure(checkpoint_path: Path, sentence: str, layer: int | None, head: int | None, output: Path) -> Any:
    """`nmt plot attention`: record one sentence's attention and draw it to `output` (.png, .svg, .pdf)."""
    check_output(output)
    pyplot()  # fail on a missing matplotlib before loading the model
    return plot_attention(sentence_attention(checkpoint_path, sentence), layer, head, output)


def select_heads(att: SentenceAttention, layer: int | None, head: int | None) -> tuple[int, list[int]]:
    """1-based --layer (default: the last) and --head (None: all) -> 0-based layer and head indices."""
    n_layers, n_heads = len(att.weights["encoder"]), att.weights["encoder"][0].shape[0]
    n_dec = len(att.weights["decoder"])
    layer = layer or min(n_layers, n_dec)
    if not 1 <= layer <= min(n_layers, n_dec):
        raise ConfigError(
            f"--layer {layer} is out of range: the model has {n_layers} encoder and {n_dec} "
            "decoder layers (counted from 1)"
        )
    if head is not None and not 1 <= head <= n_heads:
        raise ConfigError(f"--head {head} is out of range: the model has {n_heads} heads (counted from 1)")
    return layer - 1, list(range(n_heads)) if head is None else [head - 1]


def draw_map(ax: Any, weights: Tensor, keys: list[str], queries: list[str], title: str) -> None:
    """One heat map: queries down, keys across, weight 0 white to 1 dark."""
    ax.imshow(weights.numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
    ax.set_yticks(range(len(queries)), queries, fontsize=7)
    ax.set_title(title, fontsize=8)


def plot_attention(att: SentenceAttention, layer: int | None, head: int | None, output: Path) -> Any:
    """Draw the three kinds of attention of one layer (rows) for one head or all (columns); write `output`. Returns
    the matplotlib Figure; its axes hold the drawn arrays (`ax.images[0].get_array()`)."""
    plt = pyplot()
    layer_index, heads = select_heads(att, layer, head)
    size = 1.2 + 0.22 * max(len(att.src_pieces), len(att.tgt_out_pieces))
    fig, axes = plt.subplots(
        len(KINDS), len(heads), figsize=(size * len(heads), size * len(KINDS)), squeeze=False, constrained_layout=True
    )
    for row, kind in enumerate(KINDS):
        keys, queries = att.keys_and_queries(kind)
        for col, h in enumerate(heads):
            title = f"{TITLES[kind]}, layer {layer_index + 1}, head {h + 1}"
            draw_map(axes[row][col], att.weights[kind][layer_index][h], keys, queries, title)
    save_figure(fig, output)
    return fig
