"""`nmt train --bucket-shapes`: the same loss on bucketed batches, exact resume, the padding logged."""

import logging

import numpy as np
import pytest
import torch
from conftest import TINY, nmt, tiny_train_config

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.commands.train import train
from nmt_cli.config import ARCHITECTURES, SearchConfig
from nmt_cli.data.batching import collate
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.train import trainer as trainer_module
from nmt_cli.train.loss import TranslationLoss
from nmt_cli.train.prefetch import BatchLoader

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_a_bucketed_batch_has_the_loss_and_gradient_of_the_plain_one(tiny_model, toy_data_bin):
    """Bucketing only appends padding, which the source mask and the causal target side keep out of every real
    position: convergence cannot change."""
    data = ParallelDataset(toy_data_bin, "train")
    ids = np.arange(6)
    objective = TranslationLoss(tiny_model, 0.1)
    results = []
    for batch in (collate(data, ids), collate(data, ids, bucket_limit=256)):
        tiny_model.zero_grad()
        loss, nll = objective(batch.src_tokens, batch.src_pad_mask, batch.tgt_in, batch.tgt_out)
        loss.backward()
        results.append((loss.detach(), nll, [p.grad.clone() for p in tiny_model.parameters()], batch.tgt_in.shape))
    (loss_a, nll_a, grads_a, shape_a), (loss_b, nll_b, grads_b, shape_b) = results
    assert shape_a != shape_b  # the batch was padded further
    torch.testing.assert_close(loss_b, loss_a)
    torch.testing.assert_close(nll_b, nll_a)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, atol=1e-5 * a.abs().max().item(), rtol=1e-4)  # float32 sums in other orders


def test_bucketed_training_resumes_exactly_across_epochs(toy_data_bin, tmp_path, monkeypatch, caplog):
    model = ARCHITECTURES["transformer_tiny"]
    # an epoch is 6 bucketed batches: the run resumed at update 5 crosses into epoch 2 by update 8
    cfg = dict(max_tokens=4096, bucket_shapes=True)
    with caplog.at_level(logging.INFO):
        inline = train(
            tiny_train_config(toy_data_bin, tmp_path / "inline", max_update=8, **cfg), model, SearchConfig()
        ).trainer
    assert inline.state.epoch > 1 and inline.bucket_limit == 256  # the model's positions
    # the padding against plain batches: once a run (plain batching costs host time the GPU would wait for)
    assert [r.getMessage()[:8] for r in caplog.records if "more positions" in r.getMessage()] == ["epoch 1:"]
    # the resumed run prepares its batches in the background thread, as on CUDA
    monkeypatch.setattr(
        trainer_module,
        "BatchLoader",
        lambda data, device, background, bucket_limit: BatchLoader(
            data, device, background=True, depth=2, bucket_limit=bucket_limit
        ),
    )
    train(tiny_train_config(toy_data_bin, tmp_path / "bg", max_update=5, **cfg), model, SearchConfig())
    resumed = train(
        tiny_train_config(toy_data_bin, tmp_path / "bg", max_update=8, **cfg), model, SearchConfig()
    ).trainer
    assert resumed.loader.background and resumed.loader.bucket_limit == 256
    for (name, a), b in zip(inline.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    plain = train(
        tiny_train_config(toy_data_bin, tmp_path / "plain", max_update=8, max_tokens=4096), model, SearchConfig()
    ).trainer
    assert not torch.equal(plain.model.output.weight, inline.model.output.weight)  # other batches were trained on


def test_padding_is_logged_and_switching_buckets_restarts_the_epoch(toy_data_bin, tmp_path):
    first = nmt("train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 2, "--bucket-shapes")
    assert first.exit_code == 0, first.output
    assert "epoch 1: " in first.output and "more positions" in first.output
    result = nmt("train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 3)
    assert result.exit_code == 0, result.output
    assert "--bucket-shapes False (was True): the epoch's batches differ" in result.output
    assert "more positions" not in result.output
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]["batch_in_epoch"] == 1
