"""Data-parallel plumbing for training (DistributedDataParallel, collectives); every function is a no-op in a single
process. How an update uses them: train/trainer.py."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from nmt_cli.runtime import DistInfo


def wrap_ddp(module: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """The module to run forward through: DDP over `module` with several ranks, `module` itself alone."""
    if info.world_size == 1:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    # No buffer broadcast inside forward: the only collectives are the ones train_step plans for.
    # (torch 2.13 renamed broadcast_buffers to forward_sync_buffers.)
    no_sync = (
        "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
    )
    return DDP(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        **{no_sync: False},  # type: ignore[arg-type]
    )


def collective_failure(exc: BaseException) -> str | None:
    """The first line of a failed collective's error (a timeout, a peer that died), else None. NCCL raises DistError;
    gloo a plain RuntimeError prefixed with its source location."""
    if not isinstance(exc, (dist.DistError, RuntimeError)):
        return None
    text = str(exc).strip()
    if not isinstance(exc, dist.DistError) and not re.search(r"gloo|NCCL|ProcessGroup", text):
        return None
    first = text.splitlines()[0] if text else type(exc).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", first)  # drop "[/path/to/pair.cc:537] "


def all_reduce_sum(values: Tensor, info: DistInfo) -> Tensor:
    if info.world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's `obj`, by rank, on every rank ([obj] in a single process)."""
    if info.world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_from_main(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Rank 0's values, shared with every rank in one all-reduce (the other ranks' values are ignored): for decisions
    every rank must take together but only one clock or signal handler can make."""
    if info.world_size == 1:
        return list(values)
    t = torch.tensor([v if info.is_main else 0.0 for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # x + 0.0 is exact: every rank gets rank 0's numbers bit for bit
    return t.tolist()
