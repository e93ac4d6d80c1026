"""The update mechanics: one update over this rank's batches, and the state that makes resume exact.

One update = `update_freq` batches on each of `world_size` ranks. The loss is summed over their target tokens and
the gradient divided by the global token count, so any split of the same batches over ranks and accumulation steps
gives the same update. The host waits for the device once per update (`train_step`).
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt_cli.checkpoint import make_checkpoint
from nmt_cli.config import ModelConfig, SearchConfig, TrainConfig
from nmt_cli.data.batching import Batch, bucket_limit
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.data.vocab import BOS, EOS, PAD, Vocab
from nmt_cli.errors import NmtError
from nmt_cli.model.transformer import Transformer, build_model
from nmt_cli.runtime import AMP_DTYPES, DistInfo, autocast, rng_state
from nmt_cli.train.distributed import all_reduce_sum, gather_objects, wrap_ddp
from nmt_cli.train.ema import WeightAverage
from nmt_cli.train.epoch_plan import EpochPlan, training_data
from nmt_cli.train.graphs import StepGraphs, check_cuda_graphs, cuda_step_graphs
from nmt_cli.train.loss import TranslationLoss
from nmt_cli.train.prefetch import BatchLoader
from nmt_cli.train.schedule import learning_rate
from nmt_cli.train.state import TrainState, restore_training

logger = logging.getLogger(__name__)


@dataclass
class StepStats:
    loss: float
    nll: float
    n_tokens: int
    grad_norm: float
    seconds: float


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        model_cfg: ModelConfig,
        search_cfg: SearchConfig,
        vocab: Vocab,
        meta: dict[str, Any],
        info: DistInfo,
        device: torch.device,
    ) -> None:
        self.cfg, self.model_cfg, self.search_cfg = cfg, model_cfg, search_cfg
        self.vocab, self.meta, self.info, self.device = vocab, meta, info, device
        check_cuda_graphs(cfg, device, info.world_size)
        self.train_data = training_data(cfg, meta, vocab)
        self.valid_data = ParallelDataset(Path(cfg.data_dir), "valid") if "valid" in meta["splits"] else None
        self.model = build_model(model_cfg).to(device)
        self.model.checkpoint_activations = cfg.checkpoint_activations
        self.ema = WeightAverage(self.model, cfg.ema_decay, cfg.ema_start_update) if cfg.ema_decay else None
        self.objective = TranslationLoss(self.model, cfg.label_smoothing)
        # What training's forward runs through: DDP over the objective with several ranks, else the objective.
        self.synced_objective = wrap_ddp(self.objective, info, device)
        if cfg.compile:
            compile_layers(self.model)
        self.distributed = info.world_size > 1
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # CUDA: the fused AdamW kernel (one launch for all parameters); CPU keeps PyTorch's default.
        fused = {"fused": True} if device.type == "cuda" else {}
        self.optimizer = torch.optim.AdamW(
            self.params, lr=0.0, betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay, **fused
        )
        self.amp_dtype = AMP_DTYPES[cfg.precision or "fp32"]
        # fp16: fairseq's initial loss scale, 2^7 (the loss is a sum over tokens; PyTorch's 2^16 overflows at first)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=2.0**7) if self.amp_dtype == torch.float16 else None
        # --bucket-shapes: the longest a side is padded to (0: each batch to its longest sentence)
        self.bucket_limit = bucket_limit(cfg.max_tokens, model_cfg.max_positions) if cfg.bucket_shapes else 0
        # On CUDA a background thread collates and pins the next batches; on CPU collation stays inline.
        self.loader = BatchLoader(
            self.train_data, device, background=device.type == "cuda", bucket_limit=self.bucket_limit
        )
        # --cuda-graphs: each batch shape's forward and backward captured once and replayed (train/graphs.py)
        self.graphs: StepGraphs | None = (
            cuda_step_graphs(self.objective, self.params, self.amp_dtype) if cfg.cuda_graphs else None
        )
        checksums = [meta.get("checksums", {}).get(f"train.{lang}.idx.npy") for lang in self.languages()]
        train_data = " ".join(checksums) if all(checksums) else ""  # "" for data directories without checksums
        self.state = TrainState(train_data=train_data, best_metric=cfg.best_checkpoint_metric)

    # ---- data -------------------------------------------------------------------------------------
    def languages(self) -> tuple[str, str]:
        return self.meta["source_lang"], self.meta["target_lang"]

    # ---- one update -------------------------------------------------------------------------------
    def batch_loss(self, batch: Batch, module: torch.nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and NLL over the batch's real target tokens."""
        with autocast(self.device, self.amp_dtype):
            return (self.objective if module is None else module)(
                batch.src_tokens, batch.src_pad_mask, batch.tgt_in, batch.tgt_out, batch.tgt_index
            )

    def train_step(self, group: list[np.ndarray], plan: EpochPlan | None = None) -> StepStats | None:
        """Forward/backward over this rank's batches, one host synchronisation, then step; None if skipped. plan: the
        epoch `group` was taken from at the state's batch_in_epoch (its next batches are prepared ahead), None for
        batches of the caller's own. The totals are summed over ranks and the gradient normalised and clipped on the
        device; one transfer brings them to the host, so every rank steps, or skips, together.
        """
        start = time.perf_counter()
        self.model.train()
        if plan is not None:
            self.loader.plan(plan.batches, self.state.batch_in_epoch)
        with self.update_region():
            totals = self.accumulate(group)
        totals = all_reduce_sum(totals, self.info)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        # DDP averages the ranks' gradients; the update wants their sum over the global token count.
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, self.info.world_size / totals[2].clamp(min=1))
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        # The update's one host synchronisation.
        # (clip_grad_norm_ answers on the CPU when no parameter has a gradient: a rank that failed at once.)
        norm_t = grad_norm.to(totals.device, torch.float64).view(1)
        loss_sum, nll_sum, n_tokens, n_failed, norm = torch.cat([totals, norm_t]).tolist()
        if n_failed or not (math.isfinite(loss_sum) and math.isfinite(norm)):
            self.skip_update(loss_sum, norm, failed=bool(n_failed))
            return None
        return self.apply_update(loss_sum, nll_sum, int(n_tokens), norm, time.perf_counter() - start)

    def accumulate(self, group: list[np.ndarray]) -> torch.Tensor:
        """Forward and backward this rank's batches; batches before the last accumulate gradients locally (DDP's
        no_sync), the last one's backward all-reduces them. Returns [loss, nll, target tokens, failed] summed over
        the batches, on the device (no host sync)."""
        totals = torch.zeros(4, dtype=torch.float64, device=self.device)
        for i, ids in enumerate(group):
            batch = self.loader.get(ids)
            sums = self.graphs.step(batch) if self.graphs is not None else None  # None: eager
            if sums is not None:
                totals[:2] += torch.stack(sums).double()
                totals[2] += batch.n_tgt_tokens
                continue
            batch = batch.to(self.device)
            syncing = i == len(group) - 1  # this batch's backward all-reduces the gradients (DDP)
            local = self.distributed and not syncing
            try:
                with self.synced_objective.no_sync() if local else nullcontext():  # type: ignore[operator]
                    loss, nll = self.batch_loss(batch, self.synced_objective)
                    if not syncing:
                        self.backward(loss)
            except torch.cuda.OutOfMemoryError:
                logger.warning(
                    "rank %d ran out of memory on a batch of %d sentences; skipping this update on every rank",
                    self.info.rank,
                    len(ids),
                )
                totals[3] += 1
                torch.cuda.empty_cache()
                self.join_gradient_sync()
                return totals
            totals[:2] += torch.stack([loss.detach(), nll.detach()]).double()
            totals[2] += batch.n_tgt_tokens
            if syncing:
                try:
                    self.backward(loss)
                except torch.cuda.OutOfMemoryError:
                    raise NmtError(
                        f"rank {self.info.rank} ran out of memory in the backward pass that "
                        "synchronises the ranks' gradients, which cannot be skipped; lower "
                        "--max-tokens"
                    ) from None
        return totals

    def join_gradient_sync(self) -> None:
        """Take part in DDP's gradient all-reduce after a failure, with a zero loss on one token: DDP expects the
        synchronising backward after every forward outside no_sync, and stays out of step with the other ranks
        without it."""
        if self.distributed:
            one = torch.tensor([[EOS]], device=self.device)
            loss, _ = self.batch_loss(
                Batch(np.zeros(1, dtype=np.int64), one, one.eq(PAD), torch.full_like(one, BOS), one, 1),
                self.synced_objective,
            )
            self.backward(loss * 0.0)

    def update_region(self) -> AbstractContextManager:
        """One autocast region over the update's batches: autocast keeps each weight's bf16 (fp16) copy until its
        outermost region ends, so the weights are cast once per update instead of once per batch."""
        return autocast(self.device, self.amp_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward, with autocast off: it runs inside train_step's autocast region (kept for its cache)."""
        with torch.autocast(self.device.type, enabled=False):
            (self.scaler.scale(loss) if self.scaler else loss).backward()

    def zero_grad(self) -> None:
        """Drop the gradients; with CUDA graphs zero them in place, since the graphs accumulate into them."""
        self.optimizer.zero_grad(set_to_none=self.graphs is None)

    def apply_update(
        self, loss_sum: float, nll_sum: float, n_tokens: int, grad_norm: float, seconds: float
    ) -> StepStats:
        """Step with gradients already normalised, clipped and known to be finite."""
        self.state.n_nonfinite_in_a_row = 0
        lr = self.lr(self.state.update + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()  # unscaled and finite: scaler.step's own inf check (a host sync) is not needed
        if self.scaler:
            self.scaler.update()
        self.zero_grad()
        self.state.advance_update()
        if self.ema is not None:
            self.ema.update(self.state.update)
        return StepStats(loss_sum / n_tokens, nll_sum / n_tokens, n_tokens, grad_norm, seconds)

    def skip_update(self, loss_sum: float, grad_norm: float, *, failed: bool) -> None:
        """Drop the update: a rank failed (out of memory), or its loss or gradient norm is not finite."""
        self.zero_grad()
        self.state.n_skipped_updates += 1
        if failed:
            if self.scaler:  # no overflow: the scale stays (the scaler needs an update after unscale_)
                self.scaler.update(self.scaler.get_scale())
            return
        if self.scaler:  # fp16 overflow: halve the loss scale and try again, down to --min-loss-scale
            scale = self.scaler.get_scale() / 2
            self.scaler.update(scale)
            self.state.n_overflows += 1
            logger.warning(
                "fp16 overflow at update %d, update skipped (%d so far); loss scale now %g",
                self.state.update + 1,
                self.state.n_overflows,
                scale,
            )
            if scale < self.cfg.min_loss_scale:
                raise NmtError(
                    f"minimum loss scale reached: fp16 overflowed at every scale down to {scale:g} "
                    f"(--min-loss-scale {self.cfg.min_loss_scale:g}); the loss is probably "
                    "diverging: lower the learning rate, set --clip-norm, or use --precision bf16"
                )
            return
        self.state.n_nonfinite_in_a_row += 1
        logger.warning(
            "non-finite loss (%s) or gradient norm (%s) at update %d; update skipped",
            loss_sum,
            grad_norm,
            self.state.update + 1,
        )
        if self.state.n_nonfinite_in_a_row >= self.cfg.max_nonfinite:
            raise NmtError(
                f"{self.state.n_nonfinite_in_a_row} updates in a row had a non-finite loss; "
                "stopping (lower --lr-scale/--lr, set --clip-norm, or check the data)"
            )

    def lr(self, update: int) -> float:
        """The learning rate of `update`, counted from where the schedule (re)started."""
        c = self.cfg
        step = update - self.state.lr_start
        return learning_rate(step, c.lr_scheduler, self.model_cfg.d_model, c.warmup_updates, c.lr_scale, c.lr)

    # ---- checkpoints ------------------------------------------------------------------------------
    def rng_states(self) -> list[dict[str, Any]]:
        """Every rank's random streams, by rank. A collective: every rank calls it at every save."""
        return gather_objects(rng_state(), self.info)

    def checkpoint(self, rng: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The whole training state as a checkpoint (nmt_cli/checkpoint/ defines the format). rng: every rank's random
        streams (`rng_states`); this process's alone when not given."""
        training = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"name": self.cfg.lr_scheduler, "update": self.state.update - self.state.lr_start},
            "grad_scaler": self.scaler.state_dict() if self.scaler else {},
            "train_state": asdict(self.state),
            "world_size": self.info.world_size,
            "rng": rng if rng is not None else [rng_state()],
        }
        return make_checkpoint(
            model_cfg=self.model_cfg,
            train_cfg=self.cfg,
            search_cfg=self.search_cfg,
            vocab=self.vocab,
            langs=self.languages(),
            weights=self.model.state_dict(),
            ema=self.ema.state_dict() if self.ema is not None else None,
            update=self.state.update,
            epoch=self.state.epoch,
            training=training,
            target_format=self.meta.get("target_format", "text"),
            tree_leaves=self.meta.get("tree_leaves"),
        )

    def restore(self, ckpt: dict[str, Any], path: Path) -> None:
        """Continue from a training checkpoint (train/state.py says what is restored)."""
        self.state = restore_training(
            ckpt,
            path,
            model=self.model,
            optimizer=self.optimizer,
            scaler=self.scaler,
            ema=self.ema,
            cfg=self.cfg,
            info=self.info,
            train_data=self.state.train_data,
            search_cfg=self.search_cfg,
        )

    def close(self) -> None:
        """Drop the DDP wrapper: its reducer must not outlive the process group (runtime.shutdown_distributed)."""
        self.synced_objective = self.objective

    def stop_reason(self) -> str | None:
        c, s = self.cfg, self.state
        if s.validation_due:  # abandoned for a signal by the run that saved: the loop does it first
            return None
        if c.max_update and s.update >= c.max_update:
            return f"reached --max-update {c.max_update}"
        if c.max_epoch and s.epoch > c.max_epoch:
            return f"reached --max-epoch {c.max_epoch}"
        if c.max_time_minutes and s.elapsed >= c.max_time_minutes * 60:
            return f"reached --max-time-minutes {c.max_time_minutes:g}"
        if c.patience and s.bad_validations >= c.patience:
            return f"no improvement in {c.patience} validations (--patience)"
        return None


def compile_layers(model: Transformer) -> None:
    """torch.compile each encoder and decoder layer in place, with dynamic shapes (regional compilation): every layer
    of a stack reuses one graph, so warm-up costs one encoder and one decoder layer, not the whole objective's far
    longer one (`benchmarks/profile_gpu.py --compile-warmup`). The modules keep their names: checkpoints are unchanged.
    """
    logger.info("compiling the model's layers (first updates are slow)")
    for layer in (*model.encoder, *model.decoder):
        layer.compile(dynamic=True)
