"""Checkpoints: atomic save, checked load, and averaging.

A checkpoint is a dict of primitives and tensors that loads with `torch.load(weights_only=True)`;
it carries the model and training configs, the search settings and the sentencepiece model, so
`generate` and `average-checkpoints` need nothing else.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from nmt_cli import __version__
from nmt_cli.config import ModelConfig, SearchConfig, config_from_dict
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import CheckpointError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format_version", "model_config", "model", "spm_model")


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file, fsync, then rename: a killed job never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load and check a checkpoint on the CPU; CheckpointError if it is missing or not one of ours."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a file that is not a checkpoint
        raise CheckpointError(f"{path} is not a readable nmt checkpoint ({type(e).__name__})") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise CheckpointError(f"{path} is not an nmt checkpoint (missing model, config or vocabulary)")
    if state["format_version"] > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {state['format_version']}; this nmt "
                              f"{__version__} reads up to {FORMAT_VERSION}; upgrade nmt")
    return state


def model_config_of(state: dict[str, Any], path: Path) -> ModelConfig:
    return config_from_dict(ModelConfig, state["model_config"], f"model config of {path}")


def search_config_of(state: dict[str, Any]) -> SearchConfig:
    return config_from_dict(SearchConfig, state.get("search_config", {}), "search config")


def vocab_of(state: dict[str, Any], path: Path) -> Vocab:
    return Vocab(state["spm_model"], f"sentencepiece model inside {path}")


def load_model_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], path: Path) -> None:
    """Load a state dict, turning shape or name mismatches into one-line CheckpointErrors."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(f"{path} does not fit this model: {name} has shape {tuple(tensor.shape)}, "
                                  f"the model needs {tuple(expected[name].shape)}")
    model.load_state_dict(weights)


def numbered_checkpoints(directory: Path) -> list[Path]:
    """checkpoint_<update>.pt files in update order."""
    found = []
    for path in directory.glob("checkpoint_*.pt"):
        match = re.fullmatch(r"checkpoint_(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [p for _, p in sorted(found)]


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """Average the weights of several checkpoints of one model (float32 or wider accumulation).

    Returns a checkpoint without optimizer state, recording which inputs it averaged.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first = load_checkpoint(paths[0])
    sums = {k: v.double() if v.is_floating_point() else v.clone() for k, v in first["model"].items()}
    for path in paths[1:]:
        state = load_checkpoint(path)
        if state["model_config"] != first["model_config"]:
            raise CheckpointError(f"{path} has another model config than {paths[0]}; only checkpoints of "
                                  "one model can be averaged")
        if set(state["model"]) != set(sums):
            raise CheckpointError(f"{path} has other parameter names than {paths[0]}")
        for k, v in state["model"].items():
            if v.shape != sums[k].shape:
                raise CheckpointError(f"{path}: {k} has shape {tuple(v.shape)}, {paths[0]} has "
                                      f"{tuple(sums[k].shape)}")
            if v.is_floating_point():
                sums[k] += v.double()
    averaged = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v
                for k, v in sums.items()}
    keep = ("format_version", "nmt_version", "model_config", "train_config", "search_config", "spm_model",
            "source_lang", "target_lang", "update", "epoch", "target_format", "tree_leaves")
    out = {k: first[k] for k in keep if k in first}
    out.update(model=averaged, averaged_from=[str(p) for p in paths], nmt_version=__version__)
    return out
