"""--ema-decay: an exponential moving average of the weights, kept in float32 in a copy of the model on its device and
moved after every optimizer step. Validation measures it, checkpoints carry it beside the weights (`ema`), and every
command that reads a checkpoint translates with it (checkpoint.translated_weights)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from nmt_cli.model.transformer import Transformer


class WeightAverage:
    """The average (`model`, in eval mode, no gradients) of `source`'s weights: decay * average + (1 - decay) *
    weights after each update from `start_update` on, a copy of the weights before it (fairseq's --ema-start-update)."""

    def __init__(self, source: Transformer, decay: float, start_update: int) -> None:
        self.model = copy.deepcopy(source).float().eval().requires_grad_(False)
        self.decay, self.start_update = decay, start_update
        # parameters() lists a tied weight once, in the same order in both models
        self.average: list[Tensor] = list(self.model.parameters())
        self.weights: list[Tensor] = list(source.parameters())

    @torch.no_grad()
    def update(self, update: int) -> None:
        """Fold in the weights after the optimizer step of `update` (counted from 1)."""
        if update < self.start_update:
            self.restart()
        else:
            torch._foreach_lerp_(self.average, self.weights, 1.0 - self.decay)

    @torch.no_grad()
    def restart(self) -> None:
        """The average becomes the weights."""
        torch._foreach_copy_(self.average, self.weights)

    def state_dict(self) -> dict[str, Tensor]:
        return self.model.state_dict()
