"""What resume restores: the training counters, and a checkpoint's state put back into a run's parts.

Exact resume needs the module weights, the optimizer and loss-scaler states, these counters, and every
rank's random streams; `restore_training` puts them back, honouring the --reset-* options.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoint import BEST, load_model_weights
from nmt_cli.config import SearchConfig, TrainConfig, config_to_dict
from nmt_cli.flags import flag_name
from nmt_cli.runtime import DistInfo, set_rng_state
from nmt_cli.train.ema import WeightAverage

logger = logging.getLogger(__name__)
RESET_FIELDS = ("reset_optimizer", "reset_lr_scheduler", "reset_dataloader")  # applied once: `resets_to_apply`


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
    # A signal abandoned the validation (and numbered save) due at this update: the resumed run does them first.
    validation_due: bool = False
    numbered_due: bool = False

    @property
    def logged_epoch(self) -> int:
        """The epoch of the latest update, as logs name it: at an epoch's end `epoch` already points at the
        next one (where a resumed run starts), but the validation and save that follow belong to the last."""
        return self.epoch - 1 if self.batch_in_epoch == 0 and self.epoch > 1 else self.epoch

    # The counters move only through these methods (trainer.py, loop.py and resume call them).
    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> TrainState:
        """A checkpoint's `train_state`; a field an older checkpoint lacks keeps its default."""
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})

    def advance_update(self) -> None:
        """An update was applied (a skipped one does not count)."""
        self.update += 1

    def consume_batches(self, n: int) -> None:
        """This rank trained on the epoch's next n batches."""
        self.batch_in_epoch += n

    def next_epoch(self) -> None:
        """Every batch of the epoch is consumed: point at the next epoch's first batch, where a resume starts."""
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def restart_epoch(self) -> None:
        """Start this epoch's batches again (they changed, or --reset-dataloader)."""
        self.batch_in_epoch = 0

    def abandon_validation(self, numbered: bool) -> None:
        """A signal stopped the validation due at this update (and the numbered save after it, when `numbered`)."""
        self.validation_due, self.numbered_due = True, numbered

    def validated(self) -> None:
        self.validation_due = self.numbered_due = False

    def restart_schedule(self) -> None:
        """The lr schedule starts again at this update (--reset-lr-scheduler); the update count goes on."""
        self.lr_start = self.update


def restore_training(
    ckpt: dict[str, Any],
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    ema: WeightAverage | None,
    cfg: TrainConfig,
    info: DistInfo,
    train_data: str,
    search_cfg: SearchConfig,
) -> TrainState:
    """Load a training checkpoint into the model, its moving average, optimizer, scaler and this rank's random streams;
    returns the counters to continue from, with what this run's options (--reset-*, other batches, another best
    metric) change. train_data: this run's `TrainState.train_data`; search_cfg: its --eval-bleu search settings."""
    load_model_weights(model, ckpt["model"], path)
    restore_average(ckpt, ema, path)
    saved = ckpt["train_state"]
    state = TrainState.from_saved(saved)
    applied = resets_to_apply(cfg, ckpt)
    resets: dict[str, Any] = {name: name in applied for name in RESET_FIELDS}
    cfg = replace(cfg, **resets)
    restore_optimizer(ckpt, optimizer, scaler, cfg)
    if cfg.reset_lr_scheduler:
        logger.info("--reset-lr-scheduler: the lr schedule restarts; the update count goes on from %d", state.update)
        state.restart_schedule()
    restart_data_if_rebatched(state, ckpt, cfg, info, train_data)
    keep_best_if_comparable(state, ckpt, cfg, search_cfg)
    rngs = ckpt["rng"]  # by rank
    if len(rngs) != info.world_size:
        logger.warning(
            "checkpoint holds the random streams of %d rank(s), this run has %d; every rank continues from rank 0's",
            len(rngs),
            info.world_size,
        )
    set_rng_state(rngs[info.rank] if len(rngs) == info.world_size else rngs[0])
    return state


def restore_average(ckpt: dict[str, Any], ema: WeightAverage | None, path: Path) -> None:
    """--ema-decay's average as saved; one that a checkpoint saved without it starts from the resumed weights."""
    if ema is not None and "ema" in ckpt:
        load_model_weights(ema.model, ckpt["ema"], path)
    elif ema is not None:
        logger.info("--ema-decay: %s holds no moving average; it starts from its weights", path)
        ema.restart()


def restore_optimizer(
    ckpt: dict[str, Any], optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None, cfg: TrainConfig
) -> None:
    """Adam's moments and the fp16 loss scale from the checkpoint, unless --reset-optimizer."""
    if cfg.reset_optimizer:
        logger.info("--reset-optimizer: Adam's moments (and fp16's loss scale) start afresh")
        return
    optimizer.load_state_dict(ckpt["optimizer"])
    # load_state_dict also brings back the saved hyperparameters; the options given now win (else a changed
    # --adam-betas/--adam-eps/--weight-decay would be logged as in use and silently not applied)
    for group in optimizer.param_groups:
        group.update(betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    if scaler and ckpt.get("grad_scaler"):
        scaler.load_state_dict(ckpt["grad_scaler"])


def restart_data_if_rebatched(
    state: TrainState, ckpt: dict[str, Any], cfg: TrainConfig, info: DistInfo, train_data: str
) -> None:
    """--reset-dataloader, or batches made differently (other ranks, --max-tokens, --seed, --bucket-shapes, corpus
    weights or tags, or training data), restart the data at the start of the saved epoch."""
    if cfg.reset_dataloader:
        logger.info("--reset-dataloader: the data restarts at the beginning of epoch %d", state.epoch)
    saved_world, saved_cfg = ckpt.get("world_size", 1), ckpt.get("train_config", {})
    rebatched = [
        f"{flag_name(name)} {getattr(cfg, name)} (was {saved_cfg[name]})"
        for name in ("max_tokens", "seed", "bucket_shapes", "train_weights", "corpus_tags")
        if name in saved_cfg and saved_cfg[name] != getattr(cfg, name)
    ]
    if saved_world != info.world_size:
        rebatched.insert(0, f"{info.world_size} ranks (was {saved_world})")
    if state.train_data and train_data and state.train_data != train_data:
        rebatched.insert(0, f"{cfg.data_dir} holds other training data (its sentences' lengths differ)")
    state.train_data = train_data
    if cfg.reset_dataloader or rebatched:
        if not cfg.reset_dataloader and state.batch_in_epoch:
            logger.warning(
                "%s: the epoch's batches differ, so the data iterator restarts at the beginning of epoch %d",
                ", ".join(rebatched),
                state.epoch,
            )
        state.restart_epoch()


def keep_best_if_comparable(
    state: TrainState, ckpt: dict[str, Any], cfg: TrainConfig, search_cfg: SearchConfig
) -> None:
    """The best value so far carries over only when the next validations measure the same thing: the same
    --best-checkpoint-metric (a loss and a BLEU score do not compare) and, for BLEU, the same search settings."""
    metric = cfg.best_checkpoint_metric
    saved_metric = state.best_metric or ckpt.get("train_config", {}).get("best_checkpoint_metric")
    saved_search, search = ckpt.get("search_config", {}), config_to_dict(search_cfg)
    changed = [
        f"{k} {search[k]} (was {saved_search[k]})" for k in search if k in saved_search and saved_search[k] != search[k]
    ]
    if changed:
        logger.info("--eval-bleu search settings differ from the checkpoint's: %s", ", ".join(changed))
    if state.best is not None and saved_metric not in (None, metric):
        start_best_again(
            state,
            f"--best-checkpoint-metric {metric} (was {saved_metric}): the best so far ({state.best:g}) "
            "does not compare",
        )
    elif state.best is not None and changed and metric == "bleu":
        start_best_again(state, f"the best BLEU so far ({state.best:g}) was measured with other search settings")
    state.best_metric = metric


def start_best_again(state: TrainState, why: str) -> None:
    logger.warning("%s, so it starts again and %s is replaced at the next validation", why, BEST)
    state.best, state.bad_validations = None, 0


def reset_flags(cfg: TrainConfig) -> list[str]:
    """The --reset-* options given."""
    return [flag_name(field) for field in RESET_FIELDS if getattr(cfg, field)]


def resets_to_apply(cfg: TrainConfig, ckpt: dict[str, Any]) -> list[str]:
    """The --reset-* options given that the run which saved `ckpt` was not given: a reset applies once, when it
    first appears, so that the same command, rerun after a stop (a signal, --max-update), resumes exactly. To reset
    again, resume once without it."""
    saved = ckpt.get("train_config", {})
    again = [name for name in RESET_FIELDS if getattr(cfg, name) and saved.get(name)]
    if again:
        logger.info(
            "%s: applied when this run began; not again at this resume",
            " and ".join(flag_name(name) for name in again),
        )
    return [name for name in RESET_FIELDS if getattr(cfg, name) and name not in again]
