"""A checkpoint as translating reads it (`read_saved_model` -> SavedModel), its model built around its own tensors,
and whether two checkpoints fit together (`mismatch`: an ensemble's members, the checkpoints averaged)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoint import (
    check_same_data,
    load_checkpoint,
    load_model_weights,
    model_config_of,
    search_config_of,
    shape_differences,
    translated_weights,
    vocab_of,
)
from nmt_cli.config import ModelConfig, SearchConfig, parses_trees
from nmt_cli.data.vocab import Vocab
from nmt_cli.model.transformer import Transformer, build_model


def model_around_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor], path: Path) -> Transformer:
    """The model of `cfg` holding the checkpoint's own tensors, for inference: built on the meta device, so nothing
    is allocated or initialised for weights replaced at once. Tied weights come back as parameters sharing storage."""
    with torch.device("meta"):
        model = build_model(cfg)
    load_model_weights(model, weights, path, assign=True)
    return model


@dataclass(frozen=True)
class SavedModel:
    """A checkpoint as translating reads it, once and typed; generate, serve, plot attention, export and average
    read a checkpoint through this, not through the raw dict."""

    path: Path
    config: ModelConfig
    search: SearchConfig
    vocab: Vocab
    is_parser: bool  # config.parses_trees of its target_format, asked here once
    tree_leaves: str | None  # a parser's --tree-leaves
    train_precision: str | None
    source_lang: str | None
    target_lang: str | None
    update: int | None
    weights: dict[str, torch.Tensor]
    averaged_from: tuple[str, ...] = ()  # an average's inputs (average-checkpoints), and their updates where known
    averaged_updates: tuple[int | None, ...] = ()

    def model(self) -> Transformer:
        """The model holding the checkpoint's own tensors (`model_around_weights`), in eval mode, on the CPU."""
        return model_around_weights(self.config, self.weights, self.path).eval()

    def without_weights(self) -> SavedModel:
        """The same, its weights let go (a model built from them holds its own copy)."""
        return replace(self, weights={})

    def check_same_data(self, data_dir: Path, meta: dict[str, Any], spm_bytes: bytes) -> None:
        """Refuse a data directory of another vocabulary or direction (`check_same_data`)."""
        trained = (self.source_lang, self.target_lang)
        check_same_data(self.vocab.model_bytes, trained, self.path, data_dir=data_dir, meta=meta, spm_bytes=spm_bytes)


def read_saved_model(path: Path) -> SavedModel:
    """The checkpoint at `path`, loaded and checked (`load_checkpoint`), as translating reads it."""
    return saved_model(load_checkpoint(path), path)


def saved_model(ckpt: dict[str, Any], path: Path) -> SavedModel:
    """A loaded checkpoint (`load_checkpoint`'s) as translating reads it."""
    return SavedModel(
        path=path,
        config=model_config_of(ckpt, path),
        search=search_config_of(ckpt),
        vocab=vocab_of(ckpt, path),
        is_parser=parses_trees(ckpt.get("target_format")),
        tree_leaves=ckpt.get("tree_leaves"),
        train_precision=ckpt.get("train_config", {}).get("precision"),
        source_lang=ckpt.get("source_lang"),
        target_lang=ckpt.get("target_lang"),
        update=ckpt.get("update"),
        weights=translated_weights(ckpt),
        averaged_from=tuple(ckpt.get("averaged_from", ())),
        averaged_updates=tuple(ckpt.get("averaged_updates", ())),
    )


def mismatch(first: SavedModel, other: SavedModel, *, same_shape: bool = False) -> str | None:
    """What keeps two checkpoints from translating alike (an ensemble) or, `same_shape`, from being averaged (another
    model shape, dropouts aside), said to follow "A and B"; None where they fit."""
    if other.vocab.sha256 != first.vocab.sha256:
        return "have different sentencepiece models"
    if other.config.vocab_size != first.config.vocab_size:
        return f"have vocabularies of {first.config.vocab_size} and {other.config.vocab_size} entries"
    if (first.source_lang, first.target_lang) != (other.source_lang, other.target_lang):
        return f"translate {first.source_lang}->{first.target_lang} and {other.source_lang}->{other.target_lang}"
    if first.is_parser != other.is_parser:
        return "do different tasks (parsing and translation)"
    if first.tree_leaves != other.tree_leaves:
        return f"parse with --tree-leaves {first.tree_leaves} and {other.tree_leaves}"
    if same_shape and (diff := shape_differences(first.config, other.config)):
        return f"hold models of other shapes ({', '.join(diff)})"
    return None
