"""What resume restores: the training counters, and a checkpoint's state put back into a run's parts.

Exact resume needs the module weights, the optimizer and loss-scaler states, these counters, and every
rank's random streams; `restore_training` puts them back, honouring the --reset-* options.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoint import BEST, load_model_weights
from nmt_cli.config import TrainConfig, flag_name
from nmt_cli.runtime import DistInfo, set_rng_state

logger = logging.getLogger(__name__)
RESET_FIELDS = ("reset_optimizer", "reset_lr_scheduler", "reset_dataloader")  # applied at every resume


@dataclass
class TrainState:
    """Counters that, with the module, optimizer and RNG states, make resume exact."""

    update: int = 0
    epoch: int = 1
    batch_in_epoch: int = 0  # batches of this epoch this rank has consumed
    elapsed: float = 0.0  # seconds of training wall clock, across restarts
    last_timed_save: float = 0.0
    best: float | None = None
    bad_validations: int = 0
    n_skipped_updates: int = 0
    n_nonfinite_in_a_row: int = 0
    n_overflows: int = 0  # fp16 updates skipped for an overflow (also counted in n_skipped_updates)
    lr_start: int = 0  # update at which the lr schedule (re)started: --reset-lr-scheduler
    # The training split's offsets checksums (meta.json): its sentence lengths, from which (with the ranks,
    # --max-tokens and --seed) the epoch's batches are made. "" in checkpoints older than it.
    train_data: str = ""
    best_metric: str = ""  # what `best` measures (--best-checkpoint-metric); "" in older checkpoints

    @property
    def logged_epoch(self) -> int:
        """The epoch of the latest update, as logs name it: at an epoch's end `epoch` already points at the
        next one (where a resumed run starts), but the validation and save that follow belong to the last."""
        return self.epoch - 1 if self.batch_in_epoch == 0 and self.epoch > 1 else self.epoch


def restore_training(
    ckpt: dict[str, Any],
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    cfg: TrainConfig,
    info: DistInfo,
    train_data: str,
) -> TrainState:
    """Load a training checkpoint into the model, optimizer, scaler and this rank's random streams.

    Returns the counters to continue from. --reset-optimizer keeps the fresh optimizer and scaler,
    --reset-lr-scheduler restarts the schedule at the saved update, and --reset-dataloader (or another
    number of ranks, --max-tokens, --seed or training data, whose batches differ) restarts the data at the
    start of the saved epoch. train_data: this run's `TrainState.train_data`. A best value kept by another
    --best-checkpoint-metric is dropped (a loss and a BLEU score do not compare).
    """
    load_model_weights(model, ckpt["model"], path)
    saved = ckpt["train_state"]
    state = TrainState(**{f.name: saved[f.name] for f in fields(TrainState) if f.name in saved})
    if not cfg.reset_optimizer:
        optimizer.load_state_dict(ckpt["optimizer"])
        # load_state_dict also brings back the saved hyperparameters; the options given now win (a changed
        # --adam-betas/--adam-eps/--weight-decay was logged as in use and silently not applied)
        for group in optimizer.param_groups:
            group.update(betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
        if scaler and ckpt.get("grad_scaler"):
            scaler.load_state_dict(ckpt["grad_scaler"])
    else:
        logger.info("--reset-optimizer: Adam's moments (and fp16's loss scale) start afresh")
    if cfg.reset_dataloader:
        logger.info("--reset-dataloader: the data restarts at the beginning of epoch %d", state.epoch)
    if cfg.reset_lr_scheduler:
        logger.info("--reset-lr-scheduler: the lr schedule restarts; the update count goes on from %d", state.update)
        state.lr_start = state.update
    saved_world = ckpt.get("world_size", 1)
    saved_cfg = ckpt.get("train_config", {})
    # The epoch's batches follow from the ranks, --max-tokens and --seed: with any of them changed, the
    # saved position points into other batches, so the data restarts at the start of the epoch instead.
    rebatched = [
        f"{flag_name(name)} {getattr(cfg, name)} (was {saved_cfg[name]})"
        for name in ("max_tokens", "seed")
        if name in saved_cfg and saved_cfg[name] != getattr(cfg, name)
    ]
    if saved_world != info.world_size:
        rebatched.insert(0, f"{info.world_size} ranks (was {saved_world})")
    if state.train_data and train_data and state.train_data != train_data:
        rebatched.insert(0, f"{cfg.data_dir} holds other training data (its sentences' lengths differ)")
    state.train_data = train_data
    metric, saved_metric = cfg.best_checkpoint_metric, state.best_metric or saved_cfg.get("best_checkpoint_metric")
    if state.best is not None and saved_metric not in (None, metric):
        logger.warning(
            "--best-checkpoint-metric %s (was %s): the best so far (%g) does not compare, so it starts again and "
            "%s is replaced at the next validation",
            metric,
            saved_metric,
            state.best,
            BEST,
        )
        state.best, state.bad_validations = None, 0
    state.best_metric = metric
    if cfg.reset_dataloader or rebatched:
        if not cfg.reset_dataloader and state.batch_in_epoch:
            logger.warning(
                "%s: the epoch's batches differ, so the data iterator restarts at the beginning of epoch %d",
                ", ".join(rebatched),
                state.epoch,
            )
        state.batch_in_epoch = 0
    rngs = ckpt["rng"]  # by rank
    if len(rngs) != info.world_size:
        logger.warning(
            "checkpoint holds the random streams of %d rank(s), this run has %d; every rank continues from rank 0's",
            len(rngs),
            info.world_size,
        )
    set_rng_state(rngs[info.rank] if len(rngs) == info.world_size else rngs[0])
    return state
