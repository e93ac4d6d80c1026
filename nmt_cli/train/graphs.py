"""CUDA graphs of the training step (`nmt train --cuda-graphs`): a batch's forward, loss and backward are captured
once per batch shape and replayed for every later batch of that shape (the host launches one graph instead of the
step's thousand kernels); --bucket-shapes (data/batching.py) makes the shapes few and repeating.

How the captured step keeps the eager step's numbers:

- Static buffers per `Shape`: a batch is copied into its shape's input buffers before each replay; the graph writes
  the loss and NLL sums into output buffers the trainer reads after the replay.
- A fixed-shape loss: every position of the padded batch is scored, PAD ignored (TranslationLoss.fixed_shape), where
  the eager step selects the real positions; the Triton loss (train/triton_loss.py) neither syncs nor allocates.
- Gradients: every parameter's .grad exists before the first capture, so the captured backward accumulates into
  tensors that outlive every graph; the trainer zeroes them in place (never set_to_none). The batches of an update
  (--update-freq) accumulate there whichever of them replay.
- Warm-up: each shape's step runs eagerly before its capture, into throwaway gradients, every random stream put
  back after it: it changes neither the update nor the dropout masks (a replay draws as the eager step would).
- Memory: all shapes' graphs share one pool, safe because nothing allocated in it outlives its capture (inputs,
  outputs and gradients live outside it) and replays run one at a time: the pool peaks at the largest shape's
  activations, as the eager step does.
- A shape whose warm-up or capture runs out of memory trains eagerly, with one warning.

Everything here but `cuda_capture` and `cuda_warm_up` is plain Python over a `Capture` and a `WarmUp` function,
which tests replace on the CPU."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from nmt_cli.config import TrainConfig
from nmt_cli.data.batching import Batch
from nmt_cli.errors import ConfigError
from nmt_cli.runtime import rng_state, set_rng_state
from nmt_cli.train.loss import TranslationLoss

logger = logging.getLogger(__name__)

WARM_UP_RUNS = 3  # eager runs of a shape's step before its capture (PyTorch's whole-network capture example)

# Records `run` (a step over fixed buffers) and returns what replays it.
Capture = Callable[[Callable[[], None]], Callable[[], None]]
# Runs `run` eagerly, as capture wants it run first.
WarmUp = Callable[[Callable[[], None]], None]


class Shape(NamedTuple):
    n_sentences: int  # B
    src_len: int  # S
    tgt_len: int  # T
    src_padded: bool  # the batch has a source padding mask (an unpadded CUDA batch has none: train/prefetch.py)


def shape_of(batch: Batch) -> Shape:
    b, s = batch.src_tokens.shape
    return Shape(b, s, batch.tgt_in.shape[1], batch.src_pad_mask is not None)


def check_cuda_graphs(cfg: TrainConfig, device: torch.device, world_size: int) -> None:
    """Refuse --cuda-graphs with several ranks or off CUDA (ConfigError); TrainConfig checks its other conditions."""
    if not cfg.cuda_graphs:
        return
    if world_size > 1:
        raise ConfigError(
            f"--cuda-graphs trains one process; this run has {world_size} ranks, whose gradient all-reduce "
            "(DDP's hooks) is not captured: drop --cuda-graphs"
        )
    if device.type != "cuda":
        raise ConfigError(f"--cuda-graphs captures CUDA graphs; this run trains on {device.type}: drop it there")


@dataclass
class Buffers:
    """One shape's buffers, which its graph reads and writes."""

    src_tokens: Tensor  # [B, S]
    src_pad_mask: Tensor | None  # [B, S] True at padding; None: the shape's batches have no padding
    tgt_in: Tensor  # [B, T]
    tgt_out: Tensor  # [B, T]
    loss: Tensor  # [] the loss sum, written by each replay
    nll: Tensor  # [] the NLL sum, written by each replay

    @classmethod
    def for_batch(cls, batch: Batch, device: torch.device) -> Buffers:
        def like(t: Tensor) -> Tensor:
            return torch.empty(t.shape, dtype=t.dtype, device=device)

        b = batch
        mask = None if b.src_pad_mask is None else like(b.src_pad_mask)
        out = torch.zeros((), dtype=torch.float32, device=device)
        return cls(like(b.src_tokens), mask, like(b.tgt_in), like(b.tgt_out), out, torch.zeros_like(out))

    def load(self, batch: Batch) -> None:
        """Copy the batch (on the host, pinned on CUDA, or on the device) into the buffers, in stream order."""
        self.src_tokens.copy_(batch.src_tokens, non_blocking=True)
        if self.src_pad_mask is not None:
            assert batch.src_pad_mask is not None, "a shape's batches all have a mask or none (Shape.src_padded)"
            self.src_pad_mask.copy_(batch.src_pad_mask, non_blocking=True)
        self.tgt_in.copy_(batch.tgt_in, non_blocking=True)
        self.tgt_out.copy_(batch.tgt_out, non_blocking=True)


class Captured(NamedTuple):
    buffers: Buffers
    replay: Callable[[], None]


class StepGraphs:
    """The captured training steps of one model, by batch shape (see the module's docstring)."""

    def __init__(
        self,
        objective: TranslationLoss,
        params: list[torch.nn.Parameter],
        amp_dtype: torch.dtype | None,
        *,
        capture: Capture,
        warm_up: WarmUp,
    ) -> None:
        self.objective, self.params, self.amp_dtype = objective, params, amp_dtype
        self.capture, self.warm_up = capture, warm_up
        self.device = params[0].device
        self.graphs: dict[Shape, Captured | None] = {}  # None: the shape trains eagerly (its capture failed)
        self.n_captures = 0
        self.n_replays = 0

    def step(self, batch: Batch) -> tuple[Tensor, Tensor] | None:
        """Forward and backward of `batch` by its shape's graph, its gradients added to the parameters' .grad. Returns
        the shape's (loss_sum, nll_sum) buffers, valid until its next replay (read them in stream order, no host sync);
        None when the shape trains eagerly (the caller runs the batch itself)."""
        shape = shape_of(batch)
        if shape in self.graphs:
            captured = self.graphs[shape]
            if captured is not None:
                captured.buffers.load(batch)
        else:
            captured = self.graphs[shape] = self.record(batch, shape)  # record loads the batch
        if captured is None:
            return None
        captured.replay()
        self.n_replays += 1
        return captured.buffers.loss, captured.buffers.nll

    def record(self, batch: Batch, shape: Shape) -> Captured | None:
        """Warm up and capture the step of `shape` over new buffers holding `batch`; None if memory ran out."""
        buffers = Buffers.for_batch(batch, self.device)
        buffers.load(batch)
        for p in self.params:  # the captured backward accumulates into these
            if p.grad is None:
                p.grad = torch.zeros_like(p)

        def run() -> None:
            with self.forward_autocast():
                loss, nll = self.objective.fixed_shape(
                    buffers.src_tokens, buffers.src_pad_mask, buffers.tgt_in, buffers.tgt_out
                )
            buffers.loss.copy_(loss.detach())
            buffers.nll.copy_(nll.detach())
            with torch.autocast(self.device.type, enabled=False):
                loss.backward()

        try:
            self.warm_up_aside(run)
            replay = self.capture(run)
        except torch.cuda.OutOfMemoryError:
            logger.warning(
                "out of memory capturing the training step of %d sentences, %d source and %d target positions: "
                "batches of that shape train eagerly",
                *shape[:3],
            )
            return None
        self.n_captures += 1
        logger.info("captured the training step of batch shape %s (%d graphs)", tuple(shape), self.n_captures)
        return Captured(buffers, replay)

    def warm_up_aside(self, run: Callable[[], None]) -> None:
        """Warm up with throwaway gradients and every random stream put back afterwards: the update and the dropout
        that follow are those of a run without the warm-up."""
        grads = [p.grad for p in self.params]
        streams = rng_state()
        for p in self.params:
            p.grad = torch.zeros_like(p)
        try:
            self.warm_up(run)
        finally:
            for p, grad in zip(self.params, grads):
                p.grad = grad
            set_rng_state(streams)

    def forward_autocast(self) -> AbstractContextManager:
        """The training forward's autocast, without its cast cache: a cached cast made in one step and freed when
        the trainer's region ends would be memory the graph reads; the graph casts the weights itself."""
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype, cache_enabled=False)


def cuda_capture(pool: Any) -> Capture:
    """A Capture into CUDA graphs whose memory comes from `pool` (torch.cuda.graph_pool_handle(), shared by all)."""

    def capture(run: Callable[[], None]) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        # thread_local: the batch-preparing thread's CUDA calls (pinning memory) may go on meanwhile
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            run()
        return graph.replay

    return capture


def cuda_warm_up(run: Callable[[], None]) -> None:
    """Run the step WARM_UP_RUNS times on a side stream, as PyTorch asks before a capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for _ in range(WARM_UP_RUNS):
                run()
    finally:  # also after running out of memory: the throwaway gradients are freed on the current stream
        torch.cuda.current_stream().wait_stream(stream)


def cuda_step_graphs(
    objective: TranslationLoss, params: list[torch.nn.Parameter], amp_dtype: torch.dtype | None
) -> StepGraphs:
    """The training step's graphs on CUDA, all in one shared memory pool."""
    pool = torch.cuda.graph_pool_handle()
    return StepGraphs(objective, params, amp_dtype, capture=cuda_capture(pool), warm_up=cuda_warm_up)
