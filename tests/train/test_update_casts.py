"""Under autocast the weights are cast to bf16 once per update, not once per batch, and training is unchanged."""

from contextlib import nullcontext

import pytest
import torch
from conftest import tiny_train_config
from torch.utils._python_dispatch import TorchDispatchMode

from nmt_cli.commands.train import prepare, train
from nmt_cli.config import ARCHITECTURES, SearchConfig
from nmt_cli.model import linear
from nmt_cli.train.epoch_plan import plan_epoch
from nmt_cli.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


class WeightCasts(TorchDispatchMode):
    """Counts the casts of the given tensors (by storage) to bfloat16."""

    def __init__(self, tensors):
        super().__init__()
        self.pointers, self.n = {t.data_ptr() for t in tensors}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
            self.n += args[0].data_ptr() in self.pointers
        return func(*args, **kwargs)


def test_weights_are_cast_once_per_update(toy_data_bin, tmp_path, monkeypatch):
    """Through F.linear under autocast (CUDA's route; the CPU's oneDNN route casts by itself, uncached). The output
    projection's weight is cast by the loss itself, once per batch, and not counted."""
    monkeypatch.setattr(linear, "_ONEDNN", False)
    counts = []
    for per_batch in (False, True):
        if per_batch:  # what train_step did before: each batch's own autocast region, its own casts
            monkeypatch.setattr(Trainer, "update_region", lambda self: nullcontext())
        (tmp_path / str(per_batch)).mkdir()
        cfg = tiny_train_config(toy_data_bin, tmp_path / str(per_batch), precision="bf16", update_freq=3)
        trainer = prepare(cfg, ARCHITECTURES["transformer_tiny"], SearchConfig())
        weights = [p for p in trainer.model.parameters() if p is not trainer.model.output.weight]
        with WeightCasts(weights) as casts:
            plan = plan_epoch(
                trainer.train_data, cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
            )
            assert trainer.train_step(plan.update_batches(0, 3)) is not None
        counts.append(casts.n)
    once, per_batch = counts
    assert once > 0 and per_batch == 3 * once


def test_casting_once_per_update_trains_the_same_weights(toy_data_bin, tmp_path, monkeypatch, cpu_matmul_route):
    def run(name):
        cfg = tiny_train_config(toy_data_bin, tmp_path / name, precision="bf16", update_freq=3, max_update=3)
        return train(cfg, ARCHITECTURES["transformer_tiny"], SearchConfig()).trainer.model.state_dict()

    once = run("once")
    monkeypatch.setattr(Trainer, "update_region", lambda self: nullcontext())
    per_batch = run("per-batch")
    for name, a in once.items():
        torch.testing.assert_close(a, per_batch[name], rtol=0, atol=0, msg=name)
