"""`nmt train`: the update loop, validation, checkpoint cadence and exact resume.

One update = `update_freq` batches on each of `world_size` ranks. The loss is summed over their
target tokens and the gradient divided by the global token count, so any split of the same
batches over ranks and accumulation steps gives the same update.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt_cli import __version__
from nmt_cli.config import (PARSE_SEARCH, ModelConfig, SearchConfig, TrainConfig, config_to_dict,
                            model_config_from_arch)
from nmt_cli.data.batching import Batch, batch_by_tokens, collate, epoch_batches
from nmt_cli.data.dataset import ParallelDataset, load_meta, load_vocab
from nmt_cli.data.vocab import BOS, EOS, PAD, Vocab
from nmt_cli.errors import CheckpointError, DataError, NmtError
from nmt_cli.log import print_table
from nmt_cli.model.transformer import build_model, count_parameters
from nmt_cli.runtime import (DistInfo, autocast, init_distributed, resolve_precision, seed_everything, set_threads,
                             shutdown_distributed)
from nmt_cli.checkpoint import (FORMAT_VERSION, load_checkpoint, load_model_weights, model_config_of,
                                      numbered_checkpoints, save_checkpoint)
from nmt_cli.train.distributed import all_reduce_sum, collective_failure, wrap_ddp
from nmt_cli.train.loss import TranslationLoss
from nmt_cli.train.schedule import learning_rate
from nmt_cli.train.validation import evaluate_bleu

logger = logging.getLogger(__name__)

LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"


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


@dataclass
class StepStats:
    loss: float
    nll: float
    n_tokens: int
    grad_norm: float
    seconds: float


class Trainer:
    def __init__(self, cfg: TrainConfig, model_cfg: ModelConfig, search_cfg: SearchConfig, vocab: Vocab,
                 meta: dict[str, Any], info: DistInfo, device: torch.device) -> None:
        self.cfg, self.model_cfg, self.search_cfg = cfg, model_cfg, search_cfg
        self.vocab, self.meta, self.info, self.device = vocab, meta, info, device
        data_dir = Path(cfg.data_dir)
        self.train_data = ParallelDataset(data_dir, "train")
        self.valid_data = ParallelDataset(data_dir, "valid") if "valid" in meta["splits"] else None
        self.model = build_model(model_cfg).to(device)
        self.objective = TranslationLoss(self.model, cfg.label_smoothing)
        self.ddp = wrap_ddp(self.objective, info, device)  # the objective itself in a single process
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0, betas=cfg.adam_betas, eps=cfg.adam_eps,
                                           weight_decay=cfg.weight_decay)
        self.amp_dtype = resolve_precision(device, cfg.bf16, cfg.fp16)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.state = TrainState()
        self._epoch_cache: tuple[int, list[np.ndarray]] | None = None

    # ---- data -------------------------------------------------------------------------------------
    def epoch_batches(self) -> list[np.ndarray]:
        epoch = self.state.epoch
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            batches = epoch_batches(self.train_data.src_lens, self.train_data.tgt_lens, self.cfg.max_tokens,
                                    self.cfg.seed, epoch, self.info.rank, self.info.world_size)
            if not batches:
                raise DataError(f"no training pair of {self.cfg.data_dir} fits --max-tokens {self.cfg.max_tokens}")
            self._epoch_cache = (epoch, batches)
        return self._epoch_cache[1]

    # ---- one update -------------------------------------------------------------------------------
    def batch_loss(self, batch: Batch, module: torch.nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and NLL over the batch's real target tokens."""
        with autocast(self.device, self.amp_dtype):
            return (module or self.objective)(batch.src_tokens, batch.src_pad_mask, batch.tgt_in, batch.tgt_out)

    def train_step(self, group: list[np.ndarray]) -> StepStats | None:
        """Forward/backward over this rank's batches, sync, normalise, clip, step. None if skipped.

        Batches before the last accumulate gradients locally (DDP's no_sync). The last batch's forward
        runs, then the ranks agree on loss, tokens and failures, and only then does every rank run the
        backward that all-reduces the gradients: of the real loss, or, when a rank failed or the loss
        is not finite, of a zero loss whose gradients are dropped (discard_update).
        """
        start = time.perf_counter()
        self.model.train()
        totals, last_loss = self.accumulate(group)
        loss_sum, nll_sum, n_tokens, n_failed = all_reduce_sum(totals, self.info).tolist()
        if n_failed or not math.isfinite(loss_sum):
            self.discard_update(last_loss)
            if n_failed:
                self.state.n_skipped_updates += 1
                return None
            return self.skip_nonfinite(loss_sum, math.nan)
        assert last_loss is not None
        try:
            self.backward(last_loss)
        except torch.cuda.OutOfMemoryError:
            raise NmtError(f"rank {self.info.rank} ran out of memory in the backward pass that synchronises "
                           "the ranks' gradients, which cannot be skipped; lower --max-tokens") from None
        return self.apply_update(loss_sum, nll_sum, int(n_tokens), time.perf_counter() - start)

    def accumulate(self, group: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward (and, for all but the last batch, backward) this rank's batches of the update.

        Returns [loss, nll, target tokens, failed] summed over the batches, and the last batch's loss
        (still to be backpropagated; None when this rank ran out of memory).
        """
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        for i, ids in enumerate(group):
            batch = collate(self.train_data, ids).to(self.device)
            try:
                if i == len(group) - 1:
                    loss, nll = self.batch_loss(batch, self.ddp)
                    last_loss = loss
                else:
                    with self.no_sync():
                        loss, nll = self.batch_loss(batch, self.ddp)
                        self.backward(loss)
            except torch.cuda.OutOfMemoryError:
                logger.warning("rank %d ran out of memory on a batch of %d sentences; skipping this update "
                               "on every rank", self.info.rank, len(ids))
                totals[3] += 1
                torch.cuda.empty_cache()
                return totals, None
            totals[:3] += torch.stack([loss.detach().double(), nll.detach().double(),
                                       torch.tensor(float(batch.n_tgt_tokens), dtype=torch.float64,
                                                    device=self.device)])
        return totals, last_loss

    def discard_update(self, last_loss: torch.Tensor | None) -> None:
        """Drop this update's gradients on every rank.

        DDP expects the synchronising backward after every forward outside no_sync and stays out of
        step with the other ranks without it, so each rank runs that backward on a zero loss (a rank
        that failed before its last forward runs a one-token one first), then the gradients go.
        """
        if self.ddp is not self.objective:
            if last_loss is None:
                one = torch.tensor([[EOS]], device=self.device)
                last_loss, _ = self.batch_loss(Batch(np.zeros(1, dtype=np.int64), one, one.eq(PAD),
                                                     torch.full_like(one, BOS), one, 1), self.ddp)
            (last_loss * 0.0).backward()
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def no_sync(self) -> AbstractContextManager:
        """Accumulate this batch's gradients locally; the update's last batch syncs them all."""
        return self.ddp.no_sync() if self.ddp is not self.objective else nullcontext()

    def apply_update(self, loss_sum: float, nll_sum: float, n_tokens: int, seconds: float) -> StepStats | None:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        # DDP averages the ranks' gradients; the update wants their sum over the global token count.
        torch._foreach_mul_([p.grad for p in self.params if p.grad is not None],
                            self.info.world_size / max(n_tokens, 1))
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if not (math.isfinite(grad_norm) and math.isfinite(loss_sum)):
            return self.skip_nonfinite(loss_sum, grad_norm)
        self.state.n_nonfinite_in_a_row = 0
        lr = self.lr(self.state.update + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.update += 1
        return StepStats(loss_sum / n_tokens, nll_sum / n_tokens, n_tokens, grad_norm, seconds)

    def skip_nonfinite(self, loss_sum: float, grad_norm: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.state.n_skipped_updates += 1
        if self.scaler:  # fp16 overflow: the scaler lowers the scale and we try again
            self.scaler.update(self.scaler.get_scale() / 2)
            logger.info("fp16 overflow, update skipped; loss scale now %g", self.scaler.get_scale())
            return None
        self.state.n_nonfinite_in_a_row += 1
        logger.warning("non-finite loss (%s) or gradient norm (%s) at update %d; update skipped",
                       loss_sum, grad_norm, self.state.update + 1)
        if self.state.n_nonfinite_in_a_row >= self.cfg.max_nonfinite:
            raise NmtError(f"{self.state.n_nonfinite_in_a_row} updates in a row had a non-finite loss; "
                           "stopping (lower --lr-scale/--lr, set --clip-norm, or check the data)")
        return None

    def lr(self, update: int) -> float:
        c = self.cfg
        return learning_rate(update, c.lr_scheduler, self.model_cfg.d_model, c.warmup_updates, c.lr_scale,
                             c.peak_lr)

    # ---- validation -------------------------------------------------------------------------------
    @torch.inference_mode()
    def validate(self) -> dict[str, float]:
        """Loss, nll and perplexity (base e) on the valid split; sacreBLEU too with --eval-bleu."""
        assert self.valid_data is not None
        self.model.eval()
        data = self.valid_data
        batches, _ = batch_by_tokens(data.src_lens.clip(max=self.model_cfg.max_positions - 1),
                                     data.tgt_lens.clip(max=self.model_cfg.max_positions - 1),
                                     max(self.cfg.max_tokens, self.model_cfg.max_positions), None)
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        for ids in batches[self.info.rank::self.info.world_size]:
            batch = collate(data, ids, self.model_cfg.max_positions).to(self.device)
            loss, nll = self.batch_loss(batch)
            totals += torch.tensor([loss.item(), nll.item(), batch.n_tgt_tokens], dtype=torch.float64,
                                   device=self.device)
        loss_sum, nll_sum, n_tokens = all_reduce_sum(totals, self.info).tolist()
        result = {"valid_loss": loss_sum / n_tokens, "valid_nll": nll_sum / n_tokens,
                  "valid_ppl": math.exp(min(nll_sum / n_tokens, 100.0))}
        if self.cfg.eval_bleu:
            result["valid_bleu"] = evaluate_bleu(self.model, data, self.vocab, self.search_cfg,
                                                 self.cfg.eval_bleu_max_tokens, self.device, self.amp_dtype,
                                                 self.info)
        self.model.train()
        return result

    def record_validation(self, result: dict[str, float]) -> bool:
        """Update best/patience; True when this validation is the best so far."""
        metric = self.cfg.best_checkpoint_metric
        value = result["valid_bleu"] if metric == "bleu" else result["valid_loss"]
        best = self.state.best
        improved = best is None or (value > best if metric == "bleu" else value < best)
        if improved:
            self.state.best, self.state.bad_validations = value, 0
        else:
            self.state.bad_validations += 1
        return improved

    # ---- checkpoints ------------------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        name, key, pos, has_gauss, gauss = np.random.get_state()
        rng = {"python": random.getstate(), "numpy": [name, key.tolist(), pos, has_gauss, gauss],
               "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "format_version": FORMAT_VERSION, "nmt_version": __version__,
            "model_config": config_to_dict(self.model_cfg), "train_config": config_to_dict(self.cfg),
            "search_config": config_to_dict(self.search_cfg), "spm_model": self.vocab.model_bytes,
            "source_lang": self.meta["source_lang"], "target_lang": self.meta["target_lang"],
            "target_format": self.meta.get("target_format", "text"), "tree_leaves": self.meta.get("tree_leaves"),
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": {"name": self.cfg.lr_scheduler, "update": self.state.update},
            "grad_scaler": self.scaler.state_dict() if self.scaler else {},
            "train_state": asdict(self.state), "world_size": self.info.world_size, "rng": rng,
            "update": self.state.update, "epoch": self.state.epoch,
        }

    def save(self, numbered: bool, best: bool) -> None:
        """checkpoint_last.pt always; checkpoint_<update>.pt and checkpoint_best.pt when asked. Rank 0 only."""
        if not self.info.is_main:
            return
        save_dir = Path(self.cfg.save_dir)
        state = self.checkpoint()
        save_checkpoint(state, save_dir / LAST)
        if numbered:
            save_checkpoint(state, save_dir / f"checkpoint_{self.state.update}.pt")
            if self.cfg.keep_last:
                for old in numbered_checkpoints(save_dir)[:-self.cfg.keep_last]:
                    old.unlink()
        if best:
            save_checkpoint(state, save_dir / BEST)
        logger.info("saved %s at update %d%s%s", LAST, self.state.update,
                    f" and checkpoint_{self.state.update}.pt" if numbered else "", f" and {BEST}" if best else "")

    def restore(self, ckpt: dict[str, Any], path: Path) -> None:
        c = self.cfg
        load_model_weights(self.model, ckpt["model"], path)
        self.state = TrainState(**{f.name: ckpt["train_state"][f.name] for f in fields(TrainState)})
        if not c.reset_optimizer:
            self.optimizer.load_state_dict(ckpt["optimizer"])
            if self.scaler and ckpt.get("grad_scaler"):
                self.scaler.load_state_dict(ckpt["grad_scaler"])
        if c.reset_lr_scheduler:
            logger.info("--reset-lr-scheduler: the schedule restarts at update 1")
            self.state.update = 0
        if c.reset_dataloader or ckpt.get("world_size", 1) != self.info.world_size:
            if not c.reset_dataloader:
                logger.warning("checkpoint was written with %d ranks, this run has %d; the data iterator "
                               "restarts at the beginning of epoch %d", ckpt.get("world_size", 1),
                               self.info.world_size, self.state.epoch)
            self.state.batch_in_epoch = 0
        rng = ckpt["rng"]
        random.setstate(rng["python"])
        name, key, pos, has_gauss, gauss = rng["numpy"]
        np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    def stop_reason(self) -> str | None:
        c, s = self.cfg, self.state
        if c.max_update and s.update >= c.max_update:
            return f"reached --max-update {c.max_update}"
        if c.max_epoch and s.epoch > c.max_epoch:
            return f"reached --max-epoch {c.max_epoch}"
        if c.max_time_minutes and s.elapsed >= c.max_time_minutes * 60:
            return f"reached --max-time-minutes {c.max_time_minutes:g}"
        if c.patience and s.bad_validations >= c.patience:
            return f"no improvement in {c.patience} validations (--patience)"
        return None


# ---- the command ----------------------------------------------------------------------------------
def prepare(cfg: TrainConfig, model_overrides: dict[str, Any], search_cfg: SearchConfig) -> Trainer:
    """Build the trainer, resuming from checkpoint_last.pt when the save directory has one."""
    info, device = init_distributed(cfg.device)
    if not info.is_main:  # one voice: rank 0 logs, other ranks only warn
        logging.getLogger("nmt_cli").setLevel(logging.WARNING)
    set_threads(cfg.threads)
    data_dir = Path(cfg.data_dir)
    meta = load_meta(data_dir)
    vocab = load_vocab(data_dir)
    model_cfg = model_config_from_arch(cfg.arch, meta["vocab_size"], model_overrides)
    if meta.get("target_format") == "ptb-tree" and search_cfg == SearchConfig():
        search_cfg = PARSE_SEARCH  # a parser's generate defaults: the paper's beam 21, alpha 0.3, |x| + 300
    save_dir = Path(cfg.save_dir)
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create --save-dir {save_dir}: {e.strerror}") from None
    last = save_dir / LAST
    ckpt = load_checkpoint(last) if last.exists() else None
    if ckpt is not None:
        report_differences(ckpt, model_cfg, cfg, last)
    seed_everything(cfg.seed)
    trainer = Trainer(cfg, model_cfg, search_cfg, vocab, meta, info, device)
    if ckpt is not None:
        trainer.restore(ckpt, last)
        logger.info("resuming from %s at update %d (epoch %d, batch %d)", last, trainer.state.update,
                    trainer.state.epoch, trainer.state.batch_in_epoch)
    if info.is_main:
        (save_dir / "config.json").write_text(json.dumps(
            {"model": config_to_dict(model_cfg), "train": config_to_dict(cfg),
             "search": config_to_dict(search_cfg)}, indent=2) + "\n")
    return trainer


def report_differences(ckpt: dict[str, Any], model_cfg: ModelConfig, cfg: TrainConfig, path: Path) -> None:
    saved_model = model_config_of(ckpt, path)
    if saved_model != model_cfg:
        diff = [f"{f.name}={getattr(saved_model, f.name)!r} (options say {getattr(model_cfg, f.name)!r})"
                for f in fields(ModelConfig) if getattr(saved_model, f.name) != getattr(model_cfg, f.name)]
        raise CheckpointError(f"{path} holds a model of another shape: {', '.join(diff)}; "
                              "use another --save-dir or the same model options")
    saved_train = ckpt.get("train_config", {})
    for name, value in config_to_dict(cfg).items():
        if name in saved_train and saved_train[name] != value:
            logger.info("option %s differs from the checkpoint: %r (was %r)", name, value, saved_train[name])


def train(cfg: TrainConfig, model_overrides: dict[str, Any], search_cfg: SearchConfig) -> Trainer:
    """Run `nmt train` to its stopping rule; returns the trainer (for tests and benchmarks)."""
    from nmt_cli.train.loop import run

    try:
        trainer = prepare(cfg, model_overrides, search_cfg)
        reason = trainer.stop_reason()
        if reason:
            logger.info("training already finished at update %d (%s); nothing to do", trainer.state.update, reason)
        else:
            if trainer.info.is_main:
                print_table(f"nmt train ({count_parameters(trainer.model):,} parameters)",
                            {**asdict(trainer.model_cfg), **asdict(cfg)})
            run(trainer)
        shutdown_distributed()
    except (torch.distributed.DistError, RuntimeError) as e:
        reason = collective_failure(e)  # a timeout or a peer that died: name this rank, not a traceback
        if reason is None:
            raise
        rank = os.environ.get("RANK", "0")
        raise NmtError(f"rank {rank}: a collective operation failed ({reason}); "
                       "see the other ranks' logs") from None
    return trainer
