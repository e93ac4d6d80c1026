"""Label-smoothed cross-entropy (paper §5.4, target (1 - eps) * one_hot(y) + eps / V) fused with the output
projection: the decoder's states at the M real target positions are walked in chunks, each chunk's logits turned
into the loss and folded into the gradients of the states and of the weight at once, so the [M, V] logits never exist.

Chunks are sized for the device: on CPU near the caches (`benchmarks/profile_step.py`); on CUDA as large as memory
comfortably allows, since every chunk re-reads the float32 [V, D] weight gradient. The softmax's element-wise passes
are PyTorch operations on CPU (`_softmax_blocks`) and one Triton kernel on CUDA (train/triton_loss.py), the same
float32 sums, so the two routes agree to float32 rounding."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from nmt_cli.data.vocab import PAD
from nmt_cli.model.linear import ROWS, matmul_nt, on_cpu_path, pad_rows, transposes_weight_grad, weight_grad
from nmt_cli.model.transformer import Transformer

CHUNK_ELEMENTS = 1 << 22  # CPU: logits per chunk, rows * V (16 MB of float32)
CUDA_CHUNK_ELEMENTS = 1 << 28  # elsewhere (CUDA): 1 GiB of float32 logits per chunk
BLOCK_ELEMENTS = 1 << 18  # the softmax's element-wise passes, a block of logits at a time


def chunk_rows(device_type: str, vocab: int) -> int:
    """Rows of hidden states per chunk on this device type."""
    return max(1, (CHUNK_ELEMENTS if device_type == "cpu" else CUDA_CHUNK_ELEMENTS) // vocab)


def _compute_dtype(device_type: str) -> torch.dtype:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.float32


RowsKernel = Callable[[Tensor, Tensor, float, bool, int], tuple[Tensor, Tensor]]
NO_IGNORE = -1  # ignore_index that matches no target


@functools.cache
def _triton_kernel() -> RowsKernel | None:
    """train/triton_loss.py's kernel, or None where triton does not import (a CPU-only PyTorch)."""
    try:
        from nmt_cli.train.triton_loss import smoothed_ce_rows
    except ImportError:
        return None
    return smoothed_ce_rows


def fused_kernel(z: Tensor) -> RowsKernel | None:
    """The kernel that replaces `_softmax_blocks` for logits z: Triton's on CUDA, None (PyTorch's passes) elsewhere."""
    return _triton_kernel() if z.device.type == "cuda" else None


def _smoothed_ce(z: Tensor, t: Tensor, epsilon: float, need_grad: bool, ignore_index: int) -> tuple[Tensor, Tensor]:
    """Loss and NLL sums of logits z [n, V] against targets t [n]; with need_grad, z becomes their gradient. Rows whose
    target is ignore_index add nothing and get a zero gradient."""
    kernel = fused_kernel(z)
    if kernel is not None:
        return kernel(z, t, epsilon, need_grad, ignore_index)
    return _softmax_blocks(z, t[:, None], epsilon, need_grad, ignore_index)


def _softmax_blocks(
    z: Tensor, t: Tensor, epsilon: float, need_grad: bool, ignore_index: int = NO_IGNORE
) -> tuple[Tensor, Tensor]:
    """`_smoothed_ce` in PyTorch operations, t [n, 1]: z is overwritten with softmax(z) - (1 - eps) * one_hot(t) -
    eps / V. On CPU the ten or so element-wise passes run over float32 blocks of BLOCK_ELEMENTS, which stay in
    cache between passes; on CUDA over the whole chunk at once (each block costs kernel launches there)."""
    vocab = z.shape[1]
    rows = max(1, BLOCK_ELEMENTS // vocab) if z.device.type == "cpu" else z.shape[0]
    z_max = torch.empty(z.shape[0], 1, dtype=torch.float32, device=z.device)
    total, z_mean = torch.empty_like(z_max), torch.empty_like(z_max)
    z_target = z.gather(1, t).float()
    keep = t.ne(ignore_index).float() if ignore_index != NO_IGNORE else None  # [n, 1]
    for r in range(0, z.shape[0], rows):
        block = z[r : r + rows]
        zb = block.float()  # float32 logits: zb is the block itself, written in place
        torch.mean(zb, dim=-1, keepdim=True, out=z_mean[r : r + rows])
        torch.amax(zb, dim=-1, keepdim=True, out=z_max[r : r + rows])
        zb.sub_(z_max[r : r + rows]).exp_()
        torch.sum(zb, dim=-1, keepdim=True, out=total[r : r + rows])
        if need_grad:
            zb.div_(total[r : r + rows]).sub_(epsilon / vocab)  # softmax - eps / V
            zb.scatter_add_(1, t[r : r + rows], zb.new_full((zb.shape[0], 1), -(1.0 - epsilon)))
            if keep is not None:
                zb.mul_(keep[r : r + rows])
            if zb is not block:
                block.copy_(zb)
    lse = z_max + total.log()
    nll = lse - z_target
    loss = (1.0 - epsilon) * nll + epsilon * (lse - z_mean)
    if keep is not None:
        loss, nll = loss * keep, nll * keep
    return loss.sum(), nll.sum()


class _LinearLabelSmoothedCE(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, ignore_index: int
    ) -> tuple[Tensor, Tensor]:
        device_type = hidden.device.type
        dtype = _compute_dtype(device_type)
        need_grad = hidden.requires_grad or weight.requires_grad
        vocab = weight.shape[0]
        chunk = chunk_rows(device_type, vocab)
        # Empty when no gradient is needed (validation): never read then.
        grad_hidden = torch.empty_like(hidden, dtype=torch.float32) if need_grad else hidden.new_empty(0)
        loss = hidden.new_zeros((), dtype=torch.float32)
        nll_sum = hidden.new_zeros((), dtype=torch.float32)
        with torch.autocast(device_type, enabled=False):
            w = weight.to(dtype)
            padded = on_cpu_path(w, w)  # hidden is cast to w's dtype chunk by chunk
            if padded:  # whole multiples of ROWS: oneDNN then sees a handful of shapes (model/linear.py)
                chunk = max(ROWS, chunk // ROWS * ROWS)
            # The weight gradient is summed over chunks in float32. Where weight_grad would compute each chunk's
            # as the transposed product h.T @ z [D, V] and copy it back, the [D, V] products are summed (cast to
            # float32 by the addition) and transposed once at the end.
            transposed = need_grad and transposes_weight_grad(w.t(), w)  # the columns of z [c, V] and h [c, D]
            grad_shape = weight.shape[::-1] if transposed else weight.shape
            grad_weight = (
                torch.zeros(grad_shape, dtype=torch.float32, device=weight.device) if need_grad else weight.new_empty(0)
            )
            for start in range(0, hidden.shape[0], chunk):
                h = hidden[start : start + chunk].to(dtype)
                n = h.shape[0]
                if padded:
                    h = pad_rows(h)
                z_all = matmul_nt(h, w)  # [c, V] in the compute dtype, rows past n are padding
                chunk_loss, chunk_nll = _smoothed_ce(
                    z_all[:n], target[start : start + chunk], epsilon, need_grad, ignore_index
                )
                loss += chunk_loss
                nll_sum += chunk_nll
                if need_grad:  # z_all now holds the logits' gradient
                    z_all[n:] = 0
                    grad_hidden[start : start + n] = matmul_nt(z_all, w.t())[:n]
                    if transposed:
                        grad_weight += matmul_nt(h.t(), z_all.t())  # [D, V]
                    else:
                        grad_weight += weight_grad(z_all, h)
        if transposed:
            grad_weight = grad_weight.t().contiguous()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, Tensor, None, None, None]:
        grad_hidden, grad_weight = ctx.saved_tensors
        grads = (grad_hidden * grad_loss).to(ctx.dtypes[0]), (grad_weight * grad_loss).to(ctx.dtypes[1])
        return (*grads, None, None, None)


def label_smoothed_nll(
    hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, ignore_index: int = NO_IGNORE
) -> tuple[Tensor, Tensor]:
    """Label-smoothed cross-entropy (epsilon 0: plain NLL) of softmax(hidden [M, D] @ weight [V, D].T) against
    `target` [M], rows whose target is ignore_index adding nothing and getting no gradient. Returns (loss_sum,
    nll_sum), scalars summed over the M tokens in nats; only loss_sum is differentiable."""
    return _LinearLabelSmoothedCE.apply(hidden, weight, target, epsilon, ignore_index)


class TranslationLoss(nn.Module):
    """The training objective as a module, so that DistributedDataParallel can wrap it.

    forward(src_tokens, src_pad_mask, tgt_in, tgt_out, tgt_index) -> (loss_sum, nll_sum) over the real
    (non-pad) target tokens; the decoder's states at padded positions never reach the projection.
    tgt_index: the flat positions of those tokens, computed on the host (CUDA: boolean indexing on
    the device would wait for it); None selects them with tgt_out's mask (CPU).
    """

    def __init__(self, model: Transformer, epsilon: float) -> None:
        super().__init__()
        self.model, self.epsilon = model, epsilon

    def forward(
        self,
        src_tokens: Tensor,
        src_pad_mask: Tensor | None,
        tgt_in: Tensor,
        tgt_out: Tensor,
        tgt_index: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        hidden = self.model.decode(tgt_in, self.model.encode(src_tokens, src_pad_mask))
        return self.score(hidden, tgt_out, tgt_index)

    # Under `nmt train --compile` only the encoder and decoder layers are compiled (trainer.compile_layers) and
    # this part stays eager: the selection's size depends on the data, and the loss's chunk loop would recompile
    # for every token count. Nothing here imports torch._dynamo, which every training process would pay for.
    def score(self, hidden: Tensor, tgt_out: Tensor, tgt_index: Tensor | None) -> tuple[Tensor, Tensor]:
        """(loss_sum, nll_sum) of the decoder states hidden [B, T, D] at tgt_out's real tokens."""
        if tgt_index is not None:
            hidden = hidden.flatten(0, 1).index_select(0, tgt_index)
            target = tgt_out.flatten().index_select(0, tgt_index)
        else:
            keep = tgt_out.ne(PAD)
            hidden, target = hidden[keep], tgt_out[keep]
        return label_smoothed_nll(hidden, self.model.output.weight, target, self.epsilon)

    def fixed_shape(
        self, src_tokens: Tensor, src_pad_mask: Tensor | None, tgt_in: Tensor, tgt_out: Tensor
    ) -> tuple[Tensor, Tensor]:
        """`forward` over every target position, padding included, with PAD ignored by the loss (no gradient,
        nothing summed): shapes that depend on the batch's shape alone, which a captured CUDA graph needs
        (train/graphs.py). The output projection and the loss then also run over the padded positions."""
        hidden = self.model.decode(tgt_in, self.model.encode(src_tokens, src_pad_mask))
        weight = self.model.output.weight
        return label_smoothed_nll(hidden.flatten(0, 1), weight, tgt_out.flatten(), self.epsilon, ignore_index=PAD)
