"""Checkpoints, the format defined once: make, atomic save, checked load (every field: checks.py), upgrade.

A checkpoint is a dict of primitives and tensors that loads with `torch.load(weights_only=True)`, carrying the
configs, search settings and sentencepiece model, so that translating and averaging need nothing else.
"""

from __future__ import annotations

import hashlib
import logging
import re
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from nmt_cli import __version__
from nmt_cli.checkpoint.checks import check_fields
from nmt_cli.config import ModelConfig, SearchConfig, TrainConfig, config_to_dict
from nmt_cli.data.dataset import SPM_FILE
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import CheckpointError
from nmt_cli.files import atomic_write

logger = logging.getLogger(__name__)

FORMAT_VERSION = 4
LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"
# Every checkpoint has the model keys; one that training can resume from has the training keys too.
MODEL_KEYS = (
    "format_version",
    "nmt_version",
    "model_config",
    "train_config",
    "search_config",
    "spm_model",
    "source_lang",
    "target_lang",
    "target_format",
    "tree_leaves",
    "update",
    "epoch",
    "model",
)
# Train options about how a run computes, not what it trains: not saved, so a resumed run may change them.
RUNTIME_OPTIONS = ("compile", "cudnn_attention", "cuda_graphs", "checkpoint_activations")
TRAINING_KEYS = ("optimizer", "scheduler", "grad_scaler", "train_state", "world_size", "rng")


def make_checkpoint(
    *,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    search_cfg: SearchConfig,
    vocab: Vocab,
    langs: tuple[str, str],
    weights: dict[str, torch.Tensor],
    update: int,
    epoch: int,
    training: dict[str, Any] | None = None,
    target_format: str = "text",
    tree_leaves: str | None = None,
    ema: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """A checkpoint dict with every model key, plus the training keys and `ema` (--ema-decay's weights) when given.
    target_format: "text" or "ptb-tree" (a constituency parser), with its tree_leaves ("pos" or "slot")."""
    ckpt = {
        "format_version": FORMAT_VERSION,
        "nmt_version": __version__,
        "model_config": config_to_dict(model_cfg),
        "train_config": {k: v for k, v in config_to_dict(train_cfg).items() if k not in RUNTIME_OPTIONS},
        "search_config": config_to_dict(search_cfg),
        "spm_model": vocab.model_bytes,
        "source_lang": langs[0],
        "target_lang": langs[1],
        "target_format": target_format,
        "tree_leaves": tree_leaves,
        "update": update,
        "epoch": epoch,
        "model": weights,
    }
    if training is not None:
        assert set(training) == set(TRAINING_KEYS), sorted(set(training) ^ set(TRAINING_KEYS))
        ckpt.update(training)
    if ema is not None:
        ckpt["ema"] = ema
    return ckpt


def translated_weights(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a checkpoint is translated, exported and averaged with: `ema` where present, else `model`."""
    return ckpt["ema"] if "ema" in ckpt else ckpt["model"]


def upgrade(ckpt: dict[str, Any]) -> dict[str, Any]:
    """Bring an older checkpoint to FORMAT_VERSION, one version step at a time."""
    if ckpt["format_version"] == 1:
        ckpt = upgrade_v1_to_v2(ckpt)
    if ckpt["format_version"] == 2:
        ckpt = upgrade_v2_to_v3(ckpt)
    if ckpt["format_version"] == 3:
        ckpt = upgrade_v3_to_v4(ckpt)
    return ckpt


def upgrade_v1_to_v2(ckpt: dict[str, Any]) -> dict[str, Any]:
    """v2: --arch lives in the model config only; --bf16/--fp16 became one --precision field."""
    train = dict(ckpt.get("train_config", {}))
    train.pop("arch", None)
    bf16, fp16 = train.pop("bf16", False), train.pop("fp16", False)
    train["precision"] = "fp16" if fp16 else "bf16" if bf16 else "fp32"
    return {**ckpt, "train_config": train, "format_version": 2}


def upgrade_v2_to_v3(ckpt: dict[str, Any]) -> dict[str, Any]:
    """v3: `rng` holds every rank's random streams, a list by rank; v2 held one process's."""
    if isinstance(ckpt.get("rng"), dict):
        ckpt = {**ckpt, "rng": [ckpt["rng"]]}
    return {**ckpt, "format_version": 3}


def upgrade_v3_to_v4(ckpt: dict[str, Any]) -> dict[str, Any]:
    """v4: the task is recorded (target_format "text" or "ptb-tree"); every earlier checkpoint translates."""
    return {**ckpt, "target_format": "text", "tree_leaves": None, "format_version": 4}


def has_training_state(ckpt: dict[str, Any]) -> bool:
    return all(k in ckpt for k in TRAINING_KEYS)


def save_checkpoint(ckpt: dict[str, Any], path: Path, kept: str | None = None) -> None:
    """Write atomically (files.atomic_write); DiskFullError on a full disk, `kept` saying what the user still has."""
    atomic_write(path, lambda f: torch.save(ckpt, f), "checkpoint", kept)


def check_same_data(
    spm_model: bytes,
    trained: tuple[str | None, str | None],
    ckpt_path: Path,
    *,
    data_dir: Path,
    meta: dict[str, Any],
    spm_bytes: bytes,
    remedy: str = "use a data directory of the checkpoint's languages and direction",
) -> None:
    """Refuse a data directory made with another sentencepiece model than the checkpoint's (`spm_model`), or for
    other languages or the other direction than it was trained on (`trained`; `remedy` ends that error)."""
    ours, theirs = (hashlib.sha256(model).hexdigest() for model in (spm_model, spm_bytes))
    if ours != theirs:
        raise CheckpointError(
            f"{data_dir / SPM_FILE} (sha256 {theirs[:12]}) is not the sentencepiece model of {ckpt_path} "
            f"(sha256 {ours[:12]}); the data directory was made with another vocabulary"
        )
    given = (meta["source_lang"], meta["target_lang"])
    if None not in trained and trained != given:
        raise CheckpointError(
            f"{ckpt_path} was trained {trained[0]}->{trained[1]} but {data_dir} holds {given[0]}->{given[1]}; {remedy}"
        )


def check_checksums(path: Path) -> None:
    """CheckpointError where a part of the checkpoint's zip does not match its CRC-32 (torch.load does not check),
    or the zip has lost its end; a file that is no zip is left to torch.load to refuse. About a second a GB."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, EOFError):
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04":
                raise CheckpointError(
                    f"{path} is truncated: it ends before the checkpoint does (an interrupted copy or download, or a "
                    "full disk); copy it again whole, or use another checkpoint (an earlier checkpoint_N.pt of its run)"
                ) from None
        return
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror or e}") from None
    if damaged is not None:
        raise CheckpointError(
            f"{path} is damaged: its part {damaged} does not match its checksum; use another checkpoint "
            "(an earlier checkpoint_N.pt of its run)"
        )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load and check a checkpoint on the CPU; CheckpointError if it is missing or not one of ours."""
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory; give a checkpoint file")
    if not path.is_file():
        parts = [Path(p) for p in str(path).split(":")]
        if len(parts) > 1 and all(p.is_file() for p in parts):  # fairseq's --path A.pt:B.pt, an ensemble
            raise CheckpointError(
                f"checkpoint {path} names {len(parts)} checkpoints, an ensemble, which only generate and serve "
                f"translate with; give one, or average them with `nmt average-checkpoints --inputs "
                f"{' '.join(map(str, parts))} --output average.pt`"
            )
        raise CheckpointError(f"checkpoint {path} does not exist")
    check_checksums(path)
    try:
        # Memory-mapped: an optimizer state never touched is never read, and weights are not kept twice.
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch raises many types for a file that is not a checkpoint
        raise CheckpointError(f"{path} is not a readable nmt checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or any(
        k not in ckpt for k in ("format_version", "model_config", "model", "spm_model")
    ):
        raise CheckpointError(f"{path} is not an nmt checkpoint (missing model, config or vocabulary)")
    if not isinstance(ckpt["format_version"], int):
        raise CheckpointError(f"{path} has an invalid format version {ckpt['format_version']!r}")
    if ckpt["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {ckpt['format_version']}; this nmt "
            f"{__version__} reads up to {FORMAT_VERSION}; upgrade nmt"
        )
    ckpt = upgrade(ckpt)
    check_fields(ckpt, path)
    return ckpt


def config_from_dict(cls: type, d: dict[str, Any], what: str) -> Any:
    """Rebuild a config saved in a checkpoint; unknown keys mean a newer nmt wrote it."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise CheckpointError(f"{what} has unknown fields {unknown}; it was written by a newer nmt")
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return cls(**d)


def model_config_of(ckpt: dict[str, Any], path: Path) -> ModelConfig:
    return config_from_dict(ModelConfig, ckpt["model_config"], f"model config of {path}")


def search_config_of(ckpt: dict[str, Any]) -> SearchConfig:
    return config_from_dict(SearchConfig, ckpt.get("search_config", {}), "search config")


def vocab_of(ckpt: dict[str, Any], path: Path) -> Vocab:
    return Vocab(ckpt["spm_model"], f"sentencepiece model inside {path}")


def load_model_weights(
    model: torch.nn.Module, weights: dict[str, torch.Tensor], path: Path, assign: bool = False
) -> None:
    """Load a state dict, turning shape or name mismatches into one-line CheckpointErrors. assign: the model (on
    the meta device) takes the tensors themselves instead of copies, floating ones cast to the model's dtype."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{path} does not fit this model: {name} has shape {tuple(tensor.shape)}, "
                f"the model needs {tuple(expected[name].shape)}"
            )
    if assign:
        weights = {name: t.to(expected[name].dtype) if t.is_floating_point() else t for name, t in weights.items()}
    model.load_state_dict(weights, assign=assign)


# Regularisation, not shape: a run may resume with other rates, and checkpoints that differ only in them average.
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")


def shape_differences(saved: ModelConfig, wanted: ModelConfig) -> list[str]:
    """The fields, dropouts aside, in which two model configs differ: `name=saved against wanted`."""
    return [
        f"{f.name}={getattr(saved, f.name)!r} against {getattr(wanted, f.name)!r}"
        for f in fields(ModelConfig)
        if f.name not in DROPOUTS and getattr(saved, f.name) != getattr(wanted, f.name)
    ]


def numbered_checkpoints(directory: Path) -> list[Path]:
    """checkpoint_<update>.pt files in update order."""
    found = []
    for path in directory.glob("checkpoint_*.pt"):
        match = re.fullmatch(r"checkpoint_(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [p for _, p in sorted(found)]
