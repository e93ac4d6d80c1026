"""Label-smoothed cross-entropy (paper §5.4), summed over the non-pad target tokens given to it."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Cross-entropy against (1 - eps) * one_hot(target) + eps / V, in float32.

    Args:
        logits: [M, V] at the M real (non-pad) target positions.
        target: [M] gold ids.
        epsilon: label smoothing; 0 gives plain NLL.

    Returns:
        (loss_sum, nll_sum): scalars summed over the M tokens, in nats.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)
    nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.sum(), nll.sum()
