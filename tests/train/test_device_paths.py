"""The CUDA code paths, exercised on the CPU: each is chosen by device type, and these tests force the choice.

The real thing runs in tests/test_gpu.py (`make test-gpu`) where CUDA is present.
"""

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_train_config

from nmt_cli.commands.train import train
from nmt_cli.config import ARCHITECTURES, SearchConfig
from nmt_cli.data.batching import collate
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.data.vocab import PAD
from nmt_cli.model.layers import Dropout
from nmt_cli.train import trainer as trainer_module
from nmt_cli.train.epoch_plan import plan_epoch
from nmt_cli.train.loss import CHUNK_ELEMENTS, TranslationLoss, chunk_rows
from nmt_cli.train.prefetch import BatchLoader, prepare

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_loss_chunks_are_sized_for_the_device():
    assert chunk_rows("cpu", 37000) == CHUNK_ELEMENTS // 37000  # a few hundred rows
    assert chunk_rows("cuda", 37000) >= 7000  # a 3k-token (even 7k) micro-batch is one chunk


def test_dropout_uses_the_native_kernel_off_the_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(F, "dropout", lambda x, p, training: calls.append(p) or x)
    layer = Dropout(0.3).train()
    layer(torch.ones(4, 4))
    assert calls == []  # CPU: its own mask from the dropout stream
    layer(torch.ones(4, 4, device="meta"))
    assert calls == [0.3]


def test_cuda_batches_carry_host_side_positions_and_no_mask_without_padding(toy_data_bin):
    data = ParallelDataset(toy_data_bin, "train")
    lengths = np.array([len(data.src[i]) for i in range(200)])
    same = np.flatnonzero(lengths == lengths[0])[:3]
    mixed = np.array([int(np.argmin(lengths)), int(np.argmax(lengths))])
    assert collate(data, mixed).src_pad_mask is not None
    cpu = prepare(data, mixed, torch.device("cpu"))  # the CPU path is plain collate
    assert cpu.tgt_index is None and cpu.src_pad_mask is not None
    cuda = prepare(data, mixed, torch.device("cuda"))
    assert torch.equal(cuda.src_pad_mask, cpu.src_pad_mask)
    assert torch.equal(cuda.tgt_index, cpu.tgt_out.reshape(-1).ne(PAD).nonzero().squeeze(1))
    assert prepare(data, same, torch.device("cuda")).src_pad_mask is None


def test_loss_with_host_side_positions_equals_the_masked_one(tiny_model, toy_data_bin):
    data = ParallelDataset(toy_data_bin, "train")
    batch = prepare(data, np.arange(8), torch.device("cuda"))
    objective = TranslationLoss(tiny_model, 0.1)
    masked = objective(batch.src_tokens, collate(data, np.arange(8)).src_pad_mask, batch.tgt_in, batch.tgt_out)
    indexed = objective(batch.src_tokens, batch.src_pad_mask, batch.tgt_in, batch.tgt_out, batch.tgt_index)
    torch.testing.assert_close(indexed, masked, rtol=0, atol=0)


def test_no_mask_equals_a_mask_without_padding(tiny_model):
    src = torch.randint(4, 24, (3, 7))
    with torch.no_grad():
        a = tiny_model.encode(src, None).memory
        b = tiny_model.encode(src, src.eq(PAD)).memory
    torch.testing.assert_close(a, b)


def background_loader(monkeypatch):
    """Make every Trainer prepare its batches in the background thread, as on CUDA."""
    monkeypatch.setattr(
        trainer_module,
        "BatchLoader",
        lambda data, device, background, bucket_limit: BatchLoader(
            data, device, background=True, depth=2, bucket_limit=bucket_limit
        ),
    )


def test_background_batches_change_nothing_even_across_epochs_and_a_resume(toy_data_bin, tmp_path, monkeypatch):
    model = ARCHITECTURES["transformer_tiny"]
    # an epoch is 5 batches: the run resumed at update 5 crosses into epoch 2 by update 8
    inline = train(
        tiny_train_config(toy_data_bin, tmp_path / "inline", max_update=8, max_tokens=4096), model, SearchConfig()
    ).trainer
    assert inline.state.epoch > 1  # the run crossed an epoch boundary
    background_loader(monkeypatch)
    train(tiny_train_config(toy_data_bin, tmp_path / "bg", max_update=5, max_tokens=4096), model, SearchConfig())
    resumed = train(
        tiny_train_config(toy_data_bin, tmp_path / "bg", max_update=8, max_tokens=4096), model, SearchConfig()
    ).trainer
    assert resumed.loader.background
    for (name, a), b in zip(inline.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_one_host_synchronisation_per_update(toy_data_bin, tmp_path, monkeypatch):
    """Counted on the CPU as conversions of tensors to Python values inside train_step, outside the optimizer's
    step (the CPU AdamW reads its step count with .item(); CUDA's fused AdamW does not)."""
    from nmt_cli.commands.train import prepare as prepare_trainer

    trainer = prepare_trainer(
        tiny_train_config(toy_data_bin, tmp_path, max_update=3, update_freq=3),
        ARCHITECTURES["transformer_tiny"],
        SearchConfig(),
    )
    group = plan_epoch(
        trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
    ).update_batches(0, 3)
    counts, in_step = [], []
    step = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda: in_step.append(1) or step() or in_step.clear())
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "nonzero"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, _name=name, **kwargs):
            if not in_step:
                counts.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    assert trainer.train_step(group) is not None
    monkeypatch.undo()
    assert counts == ["tolist"]


@pytest.mark.parametrize("depth", [1, 3])
def test_loader_follows_the_plan_and_falls_back_off_it(toy_data_bin, depth):
    data = ParallelDataset(toy_data_bin, "train")
    order = [np.arange(i, i + 4) for i in range(0, 40, 4)]
    loader = BatchLoader(data, torch.device("cpu"), background=True, depth=depth)
    loader.plan(order, 2)
    for ids in order[2:5]:
        assert torch.equal(loader.get(ids).tgt_out, collate(data, ids).tgt_out)
    stray = np.array([7, 3])
    assert torch.equal(loader.get(stray).src_tokens, collate(data, stray).src_tokens)  # off the plan
    loader.plan(order, 5)  # restarts
    assert torch.equal(loader.get(order[5]).tgt_in, collate(data, order[5]).tgt_in)


def test_training_stops_the_loaders_thread_before_it_returns(toy_data_bin, tmp_path, monkeypatch):
    """A prefetch thread still pinning memory at the interpreter's exit aborted `nmt train` on an H200 after its
    last update ("terminate called without an active exception"): train_loop joins it."""
    background_loader(monkeypatch)
    cfg = tiny_train_config(toy_data_bin, tmp_path / "ckpt", max_update=3)
    trainer = train(cfg, ARCHITECTURES["transformer_tiny"], SearchConfig()).trainer
    assert trainer.loader.background and trainer.loader._thread is None
    assert "nmt-batches" not in [t.name for t in threading.enumerate()]


def test_a_loader_let_go_stops_and_joins_its_thread(toy_data_bin):
    """A loader dropped while its thread prepares batches (a script's Trainer, deleted or alive at exit: the same
    finalizer runs at the interpreter's exit) has its thread stopped and joined by the time it is gone: a thread
    inside a CUDA call as the process ends aborts it."""
    data = ParallelDataset(toy_data_bin, "train")
    order = [np.arange(i, i + 2) for i in range(0, 40, 2)]
    loader = BatchLoader(data, torch.device("cpu"), background=True, depth=2)
    loader.plan(order, 0)
    loader.get(order[0])
    thread = loader._thread
    assert thread is not None and thread.is_alive()  # blocked on its full queue
    del loader  # no reference cycle: its finalizer runs here
    assert not thread.is_alive()
