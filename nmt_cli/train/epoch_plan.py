"""An epoch's plan: this rank's batches of one epoch, in training order, made once where the loop reaches the
epoch; the loop takes each update's batches from it, and the trainer's batch loader prepares the next ones ahead.

Each training corpus is cut into length-sorted batches once a run (`length_batches`, the slow part); an epoch
only draws them by --train-weights and shuffles their order (`draw_batches`), so no rank waits at an epoch's
start (benchmarks/bench_train.py --epoch-pairs). The plan is a function of the epoch, the options that make
batches (train/state.py: `restart_data_if_rebatched`) and the corpora's lengths: a resumed run goes on at its batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nmt_cli.config import TrainConfig, named_values
from nmt_cli.data.batching import bucket_limit, compare_padding, draw_batches, length_batches, rank_share
from nmt_cli.data.dataset import TRAIN, ParallelDataset, train_corpora
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import ConfigError, DataError
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


def training_data(cfg: TrainConfig, meta: dict[str, Any], vocab: Vocab) -> ParallelDataset:
    """Every training corpus of --data-dir, sources tagged by --corpus-tags; ConfigError for a corpus that
    --train-weights or --corpus-tags names and the data lacks, a tag the vocabulary lacks, or no weight above 0."""
    corpora, tags = train_corpora(meta), named_values("--corpus-tags", cfg.corpus_tags)
    for option, named in (("--train-weights", cfg.corpus_weights()), ("--corpus-tags", tags)):
        unknown = [name for name in named if name not in corpora]
        if unknown:
            raise ConfigError(
                f"{option}: {cfg.data_dir} has no training corpus {unknown[0]!r}; it has {', '.join(corpora)}"
            )
    for name, tag in tags.items():
        if tag not in vocab.tags:
            raise ConfigError(
                f"--corpus-tags {name}={tag}: {tag!r} is not a tag of {cfg.data_dir}'s vocabulary (it has "
                f"{', '.join(vocab.tags) or 'none'}); preprocess with --tags {tag!r}"
            )
    if not any(cfg.corpus_weights().get(name, 1.0) for name in corpora):
        raise ConfigError(f"--train-weights {cfg.train_weights} leaves every training corpus at weight 0")
    return ParallelDataset(Path(cfg.data_dir), TRAIN, {name: vocab.sp.piece_to_id(tag) for name, tag in tags.items()})


def corpus_batches(
    data: ParallelDataset, cfg: TrainConfig, max_positions: int, bucket_shapes: bool
) -> list[list[np.ndarray]]:
    """Each corpus's batches (arrays of sentence ids of the whole split), made once a run for --bucket-shapes
    (the padding report's others are made and dropped)."""
    key = (cfg.max_tokens, cfg.seed, max_positions, bucket_shapes)
    made = data.batches.get(key) or [
        [
            batch + span.start
            for batch in length_batches(
                data.src_lens[span.start : span.stop],
                data.tgt_lens[span.start : span.stop],
                cfg.max_tokens,
                cfg.seed,
                max_positions=max_positions,
                bucket_shapes=bucket_shapes,
                corpus=k,
            )
        ]
        for k, span in enumerate(data.corpora.values())
    ]
    if bucket_shapes == cfg.bucket_shapes:
        data.batches[key] = made
    return made


def plan_epoch(
    data: ParallelDataset,
    cfg: TrainConfig,
    *,
    max_positions: int,
    info: DistInfo,
    epoch: int,
    report_padding: bool = False,
) -> EpochPlan:
    """This rank's batches of `epoch`; DataError when no training pair fits a batch of --max-tokens. report_padding:
    with --bucket-shapes, log what the shapes cost against plain batches (once a run: they take as long again)."""
    weights = [cfg.corpus_weights().get(name, 1.0) for name in data.corpora]

    def batches_of(bucket_shapes: bool) -> tuple[list[np.ndarray], list[int]]:
        made = corpus_batches(data, cfg, max_positions, bucket_shapes)
        return draw_batches(made, weights, np.random.default_rng([cfg.seed, epoch]))

    drawn, n_pairs = batches_of(cfg.bucket_shapes)
    batches = rank_share(drawn, info.rank, info.world_size)
    if not batches:
        raise DataError(f"no training pair of {cfg.data_dir} fits --max-tokens {cfg.max_tokens}")
    if len(data.corpora) > 1:
        shares = [
            f"{name} {weight:g} x {len(span):,} = {n:,} ({100 * n / sum(n_pairs):.1f}%)"
            for (name, span), weight, n in zip(data.corpora.items(), weights, n_pairs)
        ]
        logger.info("epoch %d draws pairs by corpus: %s", epoch, ", ".join(shares))
    if report_padding and cfg.bucket_shapes:
        limit = bucket_limit(cfg.max_tokens, max_positions)
        padding = compare_padding(drawn, batches_of(False)[0], data.src_lens, data.tgt_lens, limit)
        logger.info("epoch %d: %s", epoch, padding)
    return EpochPlan(epoch, batches)
