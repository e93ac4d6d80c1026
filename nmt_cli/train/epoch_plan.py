"""An epoch's plan: this rank's batches of one epoch, in training order, made once where the loop reaches the
epoch and handed to what needs it: the loop takes each update's batches from it, and the trainer's batch loader
prepares the batches after them ahead (`Trainer.train_step`).

The plan is a deterministic function of the epoch, --seed, --max-tokens, --bucket-shapes, the ranks and the
training split's lengths, so a resumed run makes the same plan and goes on at its saved batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from nmt_cli.config import TrainConfig
from nmt_cli.data.batching import bucket_limit, compare_padding, epoch_batches
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.errors import DataError
from nmt_cli.runtime import DistInfo

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpochPlan:
    """This rank's batches of `epoch` (arrays of sentence ids), in the order they are trained on."""

    epoch: int
    batches: list[np.ndarray]

    def update_batches(self, start: int, update_freq: int) -> list[np.ndarray]:
        """The batches of the update that begins at batch `start` (fewer than update_freq at the epoch's end)."""
        return self.batches[start : start + update_freq]

    def finished(self, consumed: int) -> bool:
        """True when `consumed` batches are the whole epoch."""
        return consumed >= len(self.batches)


def plan_epoch(
    data: ParallelDataset,
    cfg: TrainConfig,
    *,
    max_positions: int,
    info: DistInfo,
    epoch: int,
    report_padding: bool = False,
) -> EpochPlan:
    """This rank's batches of `epoch`; DataError when no training pair fits a batch of --max-tokens.

    report_padding: with --bucket-shapes, log what the shapes cost against plain batches. The loop asks it once a
    run: the plain batches take as long again to make, host time the GPU would wait for at every epoch.
    """

    def batches_of(bucket_shapes: bool) -> list[np.ndarray]:
        return epoch_batches(
            data.src_lens,
            data.tgt_lens,
            max_tokens=cfg.max_tokens,
            seed=cfg.seed,
            epoch=epoch,
            rank=info.rank,
            world_size=info.world_size,
            max_positions=max_positions,
            bucket_shapes=bucket_shapes,
        )

    batches = batches_of(cfg.bucket_shapes)
    if not batches:
        raise DataError(f"no training pair of {cfg.data_dir} fits --max-tokens {cfg.max_tokens}")
    if report_padding and cfg.bucket_shapes:
        padding = compare_padding(
            batches, batches_of(False), data.src_lens, data.tgt_lens, bucket_limit(cfg.max_tokens, max_positions)
        )
        logger.info("epoch %d: %s", epoch, padding)
    return EpochPlan(epoch, batches)
