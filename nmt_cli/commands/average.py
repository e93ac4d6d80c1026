"""`nmt average-checkpoints`: average the weights of the last N (or the given) checkpoints of one model into a
checkpoint without training state (checkpoint/ keeps the format this reads and writes)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch

from nmt_cli import __version__
from nmt_cli.checkpoint import (
    BEST,
    LAST,
    MODEL_KEYS,
    TRAINING_KEYS,
    load_checkpoint,
    numbered_checkpoints,
    save_checkpoint,
    translated_weights,
)
from nmt_cli.checkpoint.saved import mismatch, saved_model
from nmt_cli.errors import CheckpointError, ConfigError
from nmt_cli.files import TMP_SUFFIX, make_parent, remove_abandoned_temporaries

logger = logging.getLogger(__name__)


def average(inputs: list[Path], num_update_checkpoints: int | None, output: Path, force: bool) -> None:
    """Average the checkpoints `inputs` name (files, or one directory's newest N) into `output`."""
    paths = checkpoints_to_average(inputs, num_update_checkpoints)
    check_average_output(output, paths, force)
    remove_abandoned_temporaries(output.parent, (f"*.pt{TMP_SUFFIX}",))  # killed runs', whatever their --output
    save_checkpoint(average_checkpoints(paths), output)
    logger.info("averaged %d checkpoints into %s: %s", len(paths), output, ", ".join(p.name for p in paths))


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """Average the weights of several checkpoints of one model (in float64) into a checkpoint without optimizer
    state, recording which inputs it averaged."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first = load_checkpoint(paths[0])
    first_saved = saved_model(first, paths[0])
    first_weights = first_saved.weights  # the moving average where a run kept one (--ema-decay)
    sums = {k: v.double() if v.is_floating_point() else v.clone() for k, v in first_weights.items()}
    by_update = {first_saved.update: [paths[0]]}  # to refuse the same weights twice
    updates = [first_saved.update]  # each input's, in order: what the average is of (serve's /info says it)
    for path in paths[1:]:
        saved = saved_model(load_checkpoint(path), path)
        if problem := mismatch(first_saved, saved, same_shape=True):
            raise CheckpointError(
                f"{paths[0]} and {path} {problem}; only checkpoints of one model (its vocabulary, languages, task "
                "and shape) can be averaged"
            )
        weights, update = saved.weights, saved.update
        if set(weights) != set(sums):
            raise CheckpointError(f"{path} has other parameter names than {paths[0]}")
        # checkpoint_last.pt is also the newest checkpoint_<update>.pt: given both, that update would count twice
        # (the earlier one is loaded again, memory-mapped, only then: no input stays mapped while averaging)
        for other in by_update.setdefault(update, []):
            others = translated_weights(load_checkpoint(other))
            if all(torch.equal(v, others[k]) for k, v in weights.items()):
                same = f"{path} is given twice" if path.samefile(other) else f"{path} and {other} hold the same weights"
                raise CheckpointError(f"{same} (update {update}); averaging would count that update twice")
        by_update[update].append(path)
        updates.append(update)
        for k, v in weights.items():
            if v.shape != sums[k].shape:
                raise CheckpointError(f"{path}: {k} has shape {tuple(v.shape)}, {paths[0]} has {tuple(sums[k].shape)}")
            if v.is_floating_point():
                sums[k] += v.double()
    averaged: dict[str, torch.Tensor] = {}
    by_storage: dict[int, torch.Tensor] = {}  # tied weights (one tensor under several names) stay tied
    for k, v in sums.items():
        ptr = first_weights[k].untyped_storage().data_ptr()
        if ptr not in by_storage:
            by_storage[ptr] = (v / len(paths)).to(first_weights[k].dtype) if v.is_floating_point() else v
        averaged[k] = by_storage[ptr]
    out = {k: first[k] for k in MODEL_KEYS if k in first}
    out.update(model=averaged, averaged_from=[str(p) for p in paths], averaged_updates=updates, nmt_version=__version__)
    return out


def checkpoints_to_average(paths: list[Path], num_update_checkpoints: int | None) -> list[Path]:
    """The files to average: the given ones, or the newest N numbered checkpoints of one directory."""
    if len(paths) == 1 and paths[0].is_dir():
        if not num_update_checkpoints:
            raise ConfigError(f"--inputs {paths[0]} is a directory; give --num-update-checkpoints N")
        found = numbered_checkpoints(paths[0])
        if len(found) < num_update_checkpoints:
            raise CheckpointError(
                f"{paths[0]} has {len(found)} numbered checkpoints, fewer than "
                f"--num-update-checkpoints {num_update_checkpoints}"
            )
        return found[-num_update_checkpoints:]
    if any(p.is_dir() for p in paths):
        raise ConfigError("--inputs takes either one directory or checkpoint files")
    if num_update_checkpoints:
        raise ConfigError(
            "--num-update-checkpoints picks the newest checkpoints of one --inputs directory; "
            "with checkpoint files, the files given are averaged"
        )
    return paths


def check_average_output(output: Path, inputs: list[Path], force: bool = False) -> None:
    """Refuse to overwrite an input, the file a save directory resumes from or keeps as its best, a checkpoint
    holding a training state (unless `force`), or anything but a checkpoint (an earlier average is replaced);
    create the output's directory."""
    if any(output.resolve() == p.resolve() or (output.exists() and output.samefile(p)) for p in inputs):
        raise ConfigError(f"--output {output} is one of the checkpoints being averaged; write elsewhere")
    if output.name in (LAST, BEST) or re.fullmatch(r"checkpoint_\d+\.pt", output.name):
        raise ConfigError(
            f"--output {output}: {output.name} is a name training writes and resumes from; "
            "choose another name, e.g. average.pt"
        )
    if output.exists():
        try:
            existing = load_checkpoint(output)
        except CheckpointError:
            raise ConfigError(
                f"--output {output} exists and is not an nmt checkpoint; averaging replaces only an earlier "
                "checkpoint, so give a new file"
            ) from None
        if any(k in existing for k in TRAINING_KEYS) and not force:  # any part of one: never lost unasked
            raise ConfigError(
                f"--output {output} holds a training state (optimizer, update {existing.get('update')}) that a run "
                "can resume from, and an average has weights only; give a new file, or --force to replace it"
            )
    make_parent(output, "--output")
