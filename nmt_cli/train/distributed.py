"""Data-parallel collectives for training; every function is a no-op in a single process.

Gradients are summed with one flat all-reduce per update, after every rank has finished its
micro-batches. Because all ranks always reach the same collectives in the same order, a rank that
skips a batch (out of memory) or sees a non-finite loss cannot leave the others waiting.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from nmt_cli.runtime import DistInfo


def all_reduce_sum(values: Tensor, info: DistInfo) -> Tensor:
    if info.world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_reduce_gradients(params: list[torch.nn.Parameter], info: DistInfo) -> None:
    """Sum the gradients of all ranks in place (one flat buffer per dtype)."""
    if info.world_size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in group:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def broadcast_flag(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """Rank 0's decision, shared with every rank (used for wall-clock decisions)."""
    if info.world_size == 1:
        return flag
    t = torch.tensor([1.0 if flag and info.is_main else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return bool(t.item() > 0)
