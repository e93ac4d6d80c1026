"""`nmt train` end to end: build (or resume) the trainer, print the settings, run the loop, leave cleanly."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from nmt_cli.checkpoint import (
    BEST,
    DROPOUTS,
    LAST,
    check_same_data,
    has_training_state,
    load_checkpoint,
    model_config_of,
    shape_differences,
)
from nmt_cli.checkpoint.checks import check_training_fields
from nmt_cli.config import (
    PARSE_SEARCH,
    ModelConfig,
    SearchConfig,
    TrainConfig,
    changed_flags,
    config_to_dict,
    parses_trees,
)
from nmt_cli.data.batching import count_too_long
from nmt_cli.data.dataset import load_meta, load_vocab
from nmt_cli.errors import CheckpointError, ConfigError, DataError, NmtError
from nmt_cli.files import LOCK_FILE, TMP_SUFFIX, atomic_write_text, make_parent, remove_stale_temporaries, run_lock
from nmt_cli.flags import flag_name
from nmt_cli.log import print_table
from nmt_cli.model.transformer import count_parameters
from nmt_cli.runtime import (
    DistInfo,
    choose_attention_backends,
    init_distributed,
    resolve_precision,
    seed_everything,
    set_threads,
    shutdown_distributed,
)
from nmt_cli.train.distributed import collective_failure
from nmt_cli.train.loop import train_loop
from nmt_cli.train.state import reset_flags
from nmt_cli.train.trainer import Trainer

# What a killed run leaves in --save-dir (atomic_write's temporaries): only those, never a user's own *.tmp.
SAVE_DIR_TEMPORARIES = (f"checkpoint*.pt{TMP_SUFFIX}", f"config.json{TMP_SUFFIX}")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stopped:
    """How `nmt train` ended: at a stopping rule (signal 0) or by a signal (checkpoint_last.pt saved); its trainer."""

    trainer: Trainer
    signal: int = 0

    @property
    def exit_status(self) -> int:
        """0, or 128 + the signal, as an interrupted program exits (130, 143): a script stops instead of going
        on with a half-trained model."""
        return 128 + self.signal if self.signal else 0


def train(cfg: TrainConfig, model_cfg: ModelConfig, search_cfg: SearchConfig) -> Stopped:
    """Run `nmt train` to its stopping rule or a signal; returns how it stopped. The vocab_size is the data's."""
    signalled = 0
    try:
        with save_dir_lock(Path(cfg.save_dir)):
            trainer = prepare(cfg, model_cfg, search_cfg)
            reason = trainer.stop_reason()
            if reason:
                logger.info("training already finished at update %d (%s); nothing to do", trainer.state.update, reason)
            else:
                if trainer.info.is_main:
                    print_table(
                        f"nmt train ({count_parameters(trainer.model):,} parameters)",
                        {**asdict(trainer.model_cfg), **asdict(trainer.cfg)},
                    )
                signalled = train_loop(trainer)
            trainer.close()  # drop DDP before the process group goes
        shutdown_distributed()
    except (torch.distributed.DistError, RuntimeError) as e:
        reason = collective_failure(e)  # a timeout or a peer that died: name this rank, not a traceback
        if reason is None:
            raise
        rank = os.environ.get("RANK", "0")
        raise NmtError(f"rank {rank}: a collective operation failed ({reason}); see the other ranks' logs") from None
    return Stopped(trainer, signalled)


@contextmanager
def save_dir_lock(save_dir: Path) -> Iterator[None]:
    """Create --save-dir and hold its lock (rank 0; other ranks follow rank 0); clear temporaries of killed runs."""
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create --save-dir {save_dir}: {e.strerror}") from None
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    with run_lock(save_dir / LOCK_FILE, "train", save_dir):
        remove_stale_temporaries(save_dir, SAVE_DIR_TEMPORARIES)
        yield


def prepare(cfg: TrainConfig, model_cfg: ModelConfig, search_cfg: SearchConfig) -> Trainer:
    """Build the trainer, resuming from checkpoint_last.pt when the save directory has one."""
    info, device = start_runtime(cfg)
    cfg = with_precision(cfg, device)
    logger.info("training on %s in %s", device, cfg.precision)
    data_dir = Path(cfg.data_dir)
    meta = load_meta(data_dir)
    vocab = load_vocab(data_dir, meta)
    model_cfg = replace(model_cfg, vocab_size=meta["vocab_size"])
    search_cfg = task_search(cfg, search_cfg, meta)
    if cfg.log_file and info.is_main:
        make_parent(Path(cfg.log_file), "--log-file")
        check_log_file(Path(cfg.log_file))
    last = Path(cfg.save_dir) / LAST
    ckpt = checkpoint_to_resume(last, cfg, model_cfg, meta, vocab.model_bytes)
    seed_everything(cfg.seed)
    trainer = Trainer(cfg, model_cfg, search_cfg, vocab, meta, info, device)
    report_long_pairs(trainer)
    check_validation(trainer)
    if ckpt is not None:
        resume(trainer, ckpt, last)
    if info.is_main:
        write_run_config(Path(cfg.save_dir), model_cfg, cfg, search_cfg)
    return trainer


def start_runtime(cfg: TrainConfig) -> tuple[DistInfo, torch.device]:
    """The process group (torchrun) and this rank's device; threads and attention backends set."""
    info, device = init_distributed(cfg.device)
    if not info.is_main:  # one voice: rank 0 logs, other ranks only warn
        logging.getLogger("nmt_cli").setLevel(logging.WARNING)
    set_threads(cfg.threads)
    choose_attention_backends(device, cfg.cudnn_attention)
    return info, device


def with_precision(cfg: TrainConfig, device: torch.device) -> TrainConfig:
    """cfg with --precision resolved for the device; refuse --min-loss-scale outside fp16."""
    precision = resolve_precision(device, cfg.precision)
    if precision != "fp16" and "--min-loss-scale" in changed_flags(cfg):
        raise ConfigError(f"--min-loss-scale bounds fp16's loss scaling; this run trains in {precision}")
    return replace(cfg, precision=precision)


def task_search(cfg: TrainConfig, search_cfg: SearchConfig, meta: dict[str, Any]) -> SearchConfig:
    """The search settings to save: a parser's data (trees) refuses --eval-bleu and saves a parser's defaults."""
    if not parses_trees(meta.get("target_format")):
        return search_cfg
    if cfg.eval_bleu:
        raise ConfigError(
            f"{cfg.data_dir} holds trees (a parser's data): --eval-bleu would score linearized trees as text; parse "
            "the valid words with `nmt generate --input`, then `nmt score --metric bracket-f1`"
        )
    # a parser's generate defaults: the paper's beam 21, alpha 0.3, |x| + 300
    return PARSE_SEARCH if search_cfg == SearchConfig() else search_cfg


def checkpoint_to_resume(
    last: Path, cfg: TrainConfig, model_cfg: ModelConfig, meta: dict[str, Any], spm_model: bytes
) -> dict[str, Any] | None:
    """checkpoint_last.pt of --save-dir, checked to continue this run on this data; None to start afresh."""
    if not last.exists():
        if resets := reset_flags(cfg):
            logger.warning("%s: %s has no %s to reset; the run starts afresh", " and ".join(resets), last.parent, LAST)
        return None
    ckpt = load_checkpoint(last)
    check_same_data(
        bytes(ckpt["spm_model"]),
        (ckpt.get("source_lang"), ckpt.get("target_lang")),
        last,
        data_dir=Path(cfg.data_dir),
        meta=meta,
        spm_bytes=spm_model,
        remedy="resume on its data directory, or train anew in another --save-dir",
    )
    check_resumable(ckpt, model_cfg, cfg, last)
    return ckpt


def resume(trainer: Trainer, ckpt: dict[str, Any], last: Path) -> None:
    """Put the checkpoint's weights, optimizer, counters and random streams into the trainer; say where it goes on."""
    trainer.restore(ckpt, last)
    logger.info(
        "resuming from %s at update %d (epoch %d, batch %d)",
        last,
        trainer.state.update,
        trainer.state.epoch,
        trainer.state.batch_in_epoch,
    )


def write_run_config(save_dir: Path, model_cfg: ModelConfig, cfg: TrainConfig, search_cfg: SearchConfig) -> None:
    """config.json beside the checkpoints, for people (the checkpoint stays the source of truth)."""
    run = {"model": config_to_dict(model_cfg), "train": config_to_dict(cfg), "search": config_to_dict(search_cfg)}
    atomic_write_text(save_dir / "config.json", json.dumps(run, indent=2) + "\n")


def check_log_file(path: Path) -> None:
    """--log-file is appended to: refuse an existing file that is not such a log (a checkpoint, a corpus)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        first = f.readline(1 << 16)
    try:
        record = json.loads(first)
    except ValueError:
        record = None
    if not isinstance(record, dict) or "event" not in record:
        raise DataError(
            f"--log-file {path} exists and is not a log of nmt train (its first line is not one of its records); "
            "appending would change it: give a new file"
        )


def report_long_pairs(trainer: Trainer) -> None:
    """Say how many pairs training skips, being longer than a batch (--max-tokens) or the model
    (--max-positions) allows, and how many validation scores cut."""
    limit = trainer.model_cfg.max_positions
    flag, budget = (
        ("--max-tokens", trainer.cfg.max_tokens) if trainer.cfg.max_tokens < limit else ("--max-positions", limit)
    )
    data = trainer.train_data
    n_long = count_too_long(data.src_lens, data.tgt_lens, budget)
    if n_long == len(data):
        raise DataError(
            f"every training pair of {trainer.cfg.data_dir} is longer than {flag} {budget} allows "
            f"(a side's pieces + 1); raise {flag}"
        )
    if not trainer.info.is_main:  # the counts are the same on every rank: said once
        return
    if n_long:
        logger.warning(
            "%d of %d training pairs are longer than %s %d allows (a side's pieces + 1); training skips them",
            n_long,
            len(data),
            flag,
            budget,
        )
    valid = trainer.valid_data
    n_long = count_too_long(valid.src_lens, valid.tgt_lens, limit) if valid is not None else 0
    if valid is not None and n_long:
        logger.warning(
            "%d of %d valid pairs are longer than --max-positions %d allows; validation scores them "
            "on their first %d pieces",
            n_long,
            len(valid),
            limit,
            limit - 1,
        )


def check_validation(trainer: Trainer) -> None:
    """Without a valid split there is no validation: refuse the options that need one, else say so."""
    if trainer.valid_data is not None:
        return
    c = trainer.cfg
    needs = [flag_name(name) for name in ("patience", "eval_bleu", "validate_interval_updates") if getattr(c, name)]
    if needs:
        raise ConfigError(
            f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} a valid split, and {c.data_dir} has none; "
            "preprocess with --validpref"
        )
    if not trainer.info.is_main:  # the same on every rank: said once
        return
    logger.warning(
        "%s has no valid split: training runs without validation and writes no %s (preprocess with --validpref)",
        c.data_dir,
        BEST,
    )


def check_resumable(ckpt: dict[str, Any], model_cfg: ModelConfig, cfg: TrainConfig, path: Path) -> None:
    """Refuse a checkpoint_last.pt that training cannot continue; log the options that changed."""
    if not has_training_state(ckpt):
        raise CheckpointError(
            f"{path} has no training state (an averaged checkpoint?); it cannot be resumed; use another --save-dir"
        )
    check_training_fields(ckpt, path)
    saved_model = model_config_of(ckpt, path)
    diff = shape_differences(saved_model, model_cfg)
    if diff:
        raise CheckpointError(
            f"{path} holds a model of another shape than the options': {', '.join(diff)}; "
            "use another --save-dir or the same model options"
        )
    saved_train = ckpt.get("train_config", {})
    changed = {name: (getattr(model_cfg, name), getattr(saved_model, name)) for name in DROPOUTS}
    for name, value in config_to_dict(cfg).items():
        if name in saved_train:
            changed[name] = value, saved_train[name]
    for name, (value, saved) in changed.items():
        if value != saved:
            logger.info("option %s differs from the checkpoint: %r (was %r)", name, value, saved)
