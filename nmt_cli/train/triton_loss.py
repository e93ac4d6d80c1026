"""The label-smoothed loss's softmax passes as one Triton kernel: the CUDA route of train/loss.py.

Given a chunk's logits z [n, V] (bf16 under autocast, else float32) and gold ids t [n], one program per row reads
the row once for its maximum, its sum of exponentials (both online, in float32) and its sum, and, when a gradient is
wanted, a second time to write softmax(z) - (1 - eps) * one_hot(t) - eps / V over z in its own dtype, where
PyTorch's element-wise passes read and write the logits about ten times (`benchmarks/profile_gpu.py`). Forward and
backward are one kernel because loss.py folds the gradient in at once and never keeps the logits. With
TRITON_INTERPRET=1 set before the import, the kernel runs on CPU tensors (tests)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 4096  # logits per load: 8 KiB of bf16; a 37k vocabulary is 10 blocks


# Reductions through tl.reduce with these rather than tl.max/tl.sum (jitted in triton's standard library when
# triton is first imported, which torch._dynamo does): then the interpreter runs every function it calls.
@triton.jit
def _add(a, b):  # type: ignore[no-untyped-def]
    return a + b


@triton.jit
def _max(a, b):  # type: ignore[no-untyped-def]
    return tl.maximum(a, b)


@triton.jit
def _smoothed_ce_rows(  # type: ignore[no-untyped-def]
    z_ptr,
    z_row_stride,
    t_ptr,
    loss_ptr,
    nll_ptr,
    vocab,
    epsilon,
    ignore_index,
    NEED_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_row_stride
    target = tl.load(t_ptr + row).to(tl.int64)
    keep = target != ignore_index
    cols = tl.arange(0, BLOCK)
    # First read: online maximum and sum of exponentials, and the plain sum (for the smoothing term).
    z_max = float("-inf")
    exp_sum = 0.0
    z_sum = 0.0
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        z = tl.load(z_row + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(z_max, tl.reduce(z, 0, _max))
        exp_sum = exp_sum * tl.exp(z_max - new_max) + tl.reduce(tl.exp(z - new_max), 0, _add)
        z_sum += tl.reduce(tl.where(offs < vocab, z, 0.0), 0, _add)
        z_max = new_max
    lse = z_max + tl.log(exp_sum)
    z_target = tl.load(z_row + tl.where(keep, target, 0)).to(tl.float32)
    nll = lse - z_target
    loss = (1.0 - epsilon) * nll + epsilon * (lse - z_sum / vocab)
    tl.store(loss_ptr + row, tl.where(keep, loss, 0.0))
    tl.store(nll_ptr + row, tl.where(keep, nll, 0.0))
    if NEED_GRAD:  # second read: the gradient over the logits, in place
        smooth = epsilon / vocab
        for start in range(0, vocab, BLOCK):
            offs = start + cols
            z = tl.load(z_row + offs, mask=offs < vocab, other=0.0).to(tl.float32)
            grad = tl.exp(z - lse) - smooth - tl.where(offs == target, 1.0 - epsilon, 0.0)
            grad = tl.where(keep, grad, 0.0)
            tl.store(z_row + offs, grad.to(z_ptr.dtype.element_ty), mask=offs < vocab)


def smoothed_ce_rows(
    z: Tensor, target: Tensor, epsilon: float, need_grad: bool, ignore_index: int = -1
) -> tuple[Tensor, Tensor]:
    """Label-smoothed loss and NLL sums (float32 scalars) of logits z [n, V], its rows contiguous, against target [n];
    with need_grad, z is overwritten with their gradient (loss.py's `_smoothed_ce`)."""
    n, vocab = z.shape
    assert z.stride(1) == 1 and target.shape == (n,), (z.stride(), target.shape)
    losses = z.new_empty(n, dtype=torch.float32)
    nlls = z.new_empty(n, dtype=torch.float32)
    if n:
        _smoothed_ce_rows[(n,)](
            z,
            z.stride(0),
            target.contiguous(),
            losses,
            nlls,
            vocab,
            float(epsilon),
            ignore_index,
            NEED_GRAD=need_grad,
            BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
            num_warps=8,  # 16 logits a thread per block: 32-byte bf16 loads
        )
    return losses.sum(), nlls.sum()
