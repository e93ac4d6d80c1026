"""`nmt train --cuda-graphs` (train/graphs.py) on the CPU, with a capture that counts and replays by running the step
again: one capture per batch shape reused by its later batches, the losses and weights of the eager trainer (with
dropout, gradient accumulation, across a resume), an out-of-memory capture that falls back to eager, the fixed-shape
loss, and every refusal's error line."""

import json
import logging
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import ONE_ROUTE, TINY, nmt, tiny_train_config

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.commands.train import train
from nmt_cli.config import ARCHITECTURES, SearchConfig
from nmt_cli.data.batching import collate
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.errors import ConfigError
from nmt_cli.train import graphs as graphs_module
from nmt_cli.train import trainer as trainer_module
from nmt_cli.train.graphs import StepGraphs, check_cuda_graphs
from nmt_cli.train.loss import TranslationLoss

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

MODEL = ARCHITECTURES["transformer_tiny"]  # dropout 0.1: the warm-up must leave the random streams as it found them


class CountingCapture:
    """Captures by keeping the step to run it again; counts captures and replays. fail_after: captures that
    succeed before every later one runs out of memory, in its capture or (fail_in "warm_up") after its warm-up's
    first run."""

    def __init__(self, fail_after=None, fail_in="capture"):
        self.captures, self.replays, self.warm_ups, self.fail_after, self.fail_in = 0, 0, 0, fail_after, fail_in

    def failing(self, where):
        return self.fail_in == where and self.fail_after is not None and self.captures >= self.fail_after

    def __call__(self, run):
        if self.failing("capture"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's capture)")
        self.captures += 1

        def replay():
            self.replays += 1
            run()

        return replay

    def warm_up(self, run):
        for _ in range(graphs_module.WARM_UP_RUNS):
            self.warm_ups += 1
            run()  # gradients and dropout draws the graphs must not keep
            if self.failing("warm_up"):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's warm-up)")


@pytest.fixture
def mock_graphs(monkeypatch):
    """--cuda-graphs on the CPU: the device check passes and the graphs capture with a CountingCapture."""
    capture = CountingCapture()
    monkeypatch.setattr(trainer_module, "check_cuda_graphs", lambda cfg, device, world_size: None)
    monkeypatch.setattr(
        trainer_module,
        "cuda_step_graphs",
        lambda objective, params, amp_dtype: StepGraphs(
            objective, params, amp_dtype, capture=capture, warm_up=capture.warm_up
        ),
    )
    return capture


def run(data_bin, save_dir, **kw):
    cfg = tiny_train_config(
        data_bin,
        save_dir,
        bucket_shapes=True,
        log_interval=1,
        log_file=str(save_dir.parent / f"{save_dir.name}.jsonl"),
        **kw,
    )
    trainer = train(cfg, MODEL, SearchConfig()).trainer
    losses = [
        (r["loss"], r["nll_loss"], r["grad_norm"]) for r in map(json.loads, open(cfg.log_file)) if r["event"] == "train"
    ]
    return trainer, losses


def assert_same_training(a, b):
    (trainer_a, losses_a), (trainer_b, losses_b) = a, b
    assert len(losses_a) == len(losses_b) > 0
    np.testing.assert_allclose(losses_a, losses_b, rtol=1e-4)
    for (name, x), y in zip(trainer_a.model.state_dict().items(), trainer_b.model.state_dict().values()):
        if name.endswith("attn.qkv.bias") or name.endswith("attn.kv.bias"):
            # The key bias adds the same score to every key of a query, which softmax ignores: its gradient is
            # zero but for rounding, which Adam scales up to steps of the learning rate on either route.
            d = MODEL.d_model
            x, y = (torch.cat([t[: -2 * d], t[-d:]]) for t in (x, y))
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, msg=lambda m: name + m)


@pytest.mark.parametrize("update_freq, precision", [(1, "fp32"), (2, "fp32"), (1, "bf16")])
def test_graphs_train_as_the_eager_trainer_with_one_capture_per_shape(
    toy_data_bin, tmp_path, mock_graphs, update_freq, precision
):
    n_updates = 6 if precision == "bf16" else 8  # bf16 is emulated on CPUs without bf16 instructions: slow
    kw = dict(update_freq=update_freq, precision=precision, max_update=n_updates)
    eager = run(toy_data_bin, tmp_path / "eager", **kw)
    graphed = run(toy_data_bin, tmp_path / "graphs", **kw, cuda_graphs=True)
    assert eager[0].graphs is None
    assert_same_training(eager, graphed)
    graphs = graphed[0].graphs
    n_batches = n_updates * update_freq
    assert graphs.n_replays == mock_graphs.replays == n_batches  # every batch, the first of its shape too
    assert graphs.n_captures == mock_graphs.captures == len(graphs.graphs) < n_batches  # shapes come back
    assert mock_graphs.warm_ups == graphs_module.WARM_UP_RUNS * mock_graphs.captures
    # the gradients stay allocated (zeroed in place) for the graphs to accumulate into
    assert all(p.grad is not None and not p.grad.any() for p in graphed[0].params)


def test_graphs_resume_exactly(toy_data_bin, tmp_path, mock_graphs):
    eager = run(toy_data_bin, tmp_path / "eager", max_update=8)
    run(toy_data_bin, tmp_path / "parts", max_update=5, cuda_graphs=True)
    resumed = run(toy_data_bin, tmp_path / "parts", max_update=8, cuda_graphs=True)
    assert resumed[0].state.update == 8 and len(resumed[1]) == 8  # the log file holds both runs' updates
    assert "cuda_graphs" not in load_checkpoint(tmp_path / "parts" / "checkpoint_last.pt")["train_config"]
    assert_same_training(eager, resumed)


@pytest.mark.parametrize("fail_in", ["warm_up", "capture"])
def test_a_shape_whose_capture_runs_out_of_memory_trains_eagerly(toy_data_bin, tmp_path, mock_graphs, caplog, fail_in):
    mock_graphs.fail_after, mock_graphs.fail_in = 1, fail_in
    eager = run(toy_data_bin, tmp_path / "eager")
    with caplog.at_level(logging.WARNING):
        graphed = run(toy_data_bin, tmp_path / "graphs", cuda_graphs=True)
    assert_same_training(eager, graphed)
    graphs = graphed[0].graphs
    eager_shapes = [shape for shape, captured in graphs.graphs.items() if captured is None]
    assert graphs.n_captures == 1 and len(eager_shapes) == len(graphs.graphs) - 1 > 0
    warnings = [r.getMessage() for r in caplog.records if "out of memory capturing" in r.getMessage()]
    assert len(warnings) == len(eager_shapes)  # one a shape, not one a batch


def test_the_fixed_shape_loss_is_the_selected_one(tiny_model, toy_data_bin):
    """Scoring every padded position with PAD ignored gives the loss and gradients of the real positions."""
    data = ParallelDataset(toy_data_bin, "train")
    batch = collate(data, np.arange(6), bucket_limit=256)
    objective = TranslationLoss(tiny_model, 0.1)
    results = []
    for score in (objective, objective.fixed_shape):
        tiny_model.zero_grad()
        loss, nll = score(batch.src_tokens, batch.src_pad_mask, batch.tgt_in, batch.tgt_out)
        loss.backward()
        results.append((loss.detach(), nll, [p.grad.clone() for p in tiny_model.parameters()]))
    (loss_a, nll_a, grads_a), (loss_b, nll_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a)
    torch.testing.assert_close(nll_b, nll_a)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, atol=1e-5 * a.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "error: --cuda-graphs captures a graph per batch shape and needs --bucket-shapes"),
        (["--bucket-shapes", "--compile"], "error: --cuda-graphs and --compile both take over the training step"),
        (["--bucket-shapes", "--precision", "fp16"], "error: --cuda-graphs captures fp32 or bf16 steps"),
        (["--bucket-shapes"], "error: --cuda-graphs captures CUDA graphs; this run trains on cpu: drop it there"),
    ],
)
def test_refusals(toy_data_bin, tmp_path, args, message):
    result = nmt("train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 1, "--cuda-graphs", *args)
    assert result.exit_code == 1
    assert [line for line in result.output.splitlines() if line.startswith("error:")] == [
        next(line for line in result.output.splitlines() if line.startswith("error:"))
    ]
    assert message in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.slow  # starts two ranks under torchrun (each imports torch); make test-all
@ONE_ROUTE  # a refusal before any matrix product
def test_several_ranks_are_refused_on_the_command_line(toy_data_bin, tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    args = ["-m", "nmt_cli", "train", str(toy_data_bin), "--save-dir", str(tmp_path), *TINY, "--max-update", "1"]
    cmd = [*launcher, *args, "--bucket-shapes", "--cuda-graphs"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert (
        errors
        == [
            "error: --cuda-graphs trains one process; this run has 2 ranks, whose gradient all-reduce "
            "(DDP's hooks) is not captured: drop --cuda-graphs"
        ]
        * 2
    ), result.stderr[-3000:]
    assert "nmt_cli" not in "".join(line for line in result.stderr.splitlines() if line.strip().startswith("File "))


def test_several_ranks_are_refused(toy_data_bin, tmp_path):
    cfg = tiny_train_config(toy_data_bin, tmp_path, device="cuda", bucket_shapes=True, cuda_graphs=True)
    with pytest.raises(ConfigError, match=r"--cuda-graphs trains one process; this run has 2 ranks"):
        check_cuda_graphs(cfg, torch.device("cuda"), world_size=2)
    check_cuda_graphs(cfg, torch.device("cuda"), world_size=1)
    check_cuda_graphs(replace(cfg, cuda_graphs=False), torch.device("cpu"), world_size=2)


def test_batches_without_source_padding_have_their_own_graph(tiny_model, toy_data_bin):
    """A CUDA batch without source padding has no mask (train/prefetch.py): its shape is captured apart, so that its
    graph takes the eager step's attention route; each graph gives the eager step's sums and gradients."""
    data = ParallelDataset(toy_data_bin, "train")
    lengths = np.array([len(s) for s in data.src])
    ids = np.flatnonzero(lengths == np.bincount(lengths).argmax())[:4]  # equal sources: no source padding
    plain = collate(data, ids)
    assert not plain.src_pad_mask.any()
    unmasked = replace(plain, src_pad_mask=None)
    capture = CountingCapture()
    objective = TranslationLoss(tiny_model.train(), 0.1)
    params = list(tiny_model.parameters())
    graphs = StepGraphs(objective, params, None, capture=capture, warm_up=capture.warm_up)
    for batch in (plain, unmasked, plain, unmasked):
        tiny_model.zero_grad()
        loss, nll = objective(batch.src_tokens, batch.src_pad_mask, batch.tgt_in, batch.tgt_out)
        loss.backward()
        want = [loss.detach(), nll, *(p.grad.clone() for p in params)]
        for p in params:
            p.grad.zero_()  # in place, as the trainer zeroes them under graphs
        got = [t.clone() for t in graphs.step(batch)] + [p.grad for p in params]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert capture.captures == 2 and capture.replays == 4
    assert [shape.src_padded for shape in graphs.graphs] == [True, False]
