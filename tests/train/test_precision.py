"""--precision resolved once, logged and stored; generate follows it on CUDA; fp16's loss scale, on CPU.

fp16 needs CUDA in a real run; here the trainer is built in fp16 on the CPU (CPU float16 autocast and
torch.amp.GradScaler("cpu")) and overflows are simulated by writing inf into a gradient.
"""

import logging

import pytest
import torch
from conftest import tiny_train_config

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.commands import train as train_command
from nmt_cli.commands.train import train
from nmt_cli.config import ARCHITECTURES, SearchConfig
from nmt_cli.errors import ConfigError, NmtError
from nmt_cli.runtime import resolve_precision
from nmt_cli.search.settings import generation_precision
from nmt_cli.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_precision_is_resolved_once_logged_and_stored(toy_data_bin, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="nmt_cli"):
        train(
            tiny_train_config(toy_data_bin, tmp_path / "a", max_update=2),
            ARCHITECTURES["transformer_tiny"],
            SearchConfig(),
        )
    assert "training on cpu in fp32" in caplog.text
    assert load_checkpoint(tmp_path / "a" / "checkpoint_last.pt")["train_config"]["precision"] == "fp32"
    train(
        tiny_train_config(toy_data_bin, tmp_path / "b", max_update=2, precision="bf16"),
        ARCHITECTURES["transformer_tiny"],
        SearchConfig(),
    )
    assert load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")["train_config"]["precision"] == "bf16"


@pytest.fixture
def keep_tf32():
    """resolve_precision sets the TF32 flags for fp32 on CUDA; put them back after the test."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_precision_defaults(monkeypatch, keep_tf32):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_precision(cpu, None) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision(cuda, None) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_precision(cuda, None) == "fp32" and torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        resolve_precision(cpu, "fp16")


@pytest.mark.parametrize("has_bf16", [True, False])
def test_bf16_on_a_cpu_without_bf16_instructions_warns_that_fp32_is_faster(has_bf16, monkeypatch, caplog):
    from nmt_cli import runtime

    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: has_bf16)
    with caplog.at_level(logging.WARNING, logger="nmt_cli.runtime"):
        assert resolve_precision(torch.device("cpu"), "bf16") == "bf16"
        assert resolve_precision(torch.device("cpu"), "fp32") == "fp32"
    assert ("no bfloat16 instructions" in caplog.text) is not has_bf16
    assert caplog.text.count("training many times slower") == (not has_bf16)
    caplog.clear()  # generate, serve and score-pairs: no training there (the warning had said so)
    with caplog.at_level(logging.WARNING, logger="nmt_cli.runtime"):
        assert generation_precision("bf16", torch.device("cpu"), None) == "bf16"
    assert ("inference many times slower" in caplog.text) is not has_bf16 and "training" not in caplog.text


@pytest.mark.parametrize("saved", ["fp32", "bf16", "fp16"])
def test_generate_follows_the_checkpoints_precision_on_cuda_unless_told(saved, keep_tf32):
    assert generation_precision(None, torch.device("cuda"), saved) == saved
    assert generation_precision("bf16", torch.device("cuda"), saved) == "bf16"
    assert generation_precision(None, torch.device("cpu"), saved) == "fp32"  # CPU: its fastest float path


@pytest.fixture
def fp16_on_cpu(monkeypatch):
    """Let `train` build an fp16 trainer on the CPU (resolve_precision refuses fp16 there)."""
    monkeypatch.setattr(train_command, "resolve_precision", lambda device, precision: precision or "fp32")


def overflow_on(monkeypatch, attempts):
    """Write inf into a gradient in the given update attempts (counted from 1), as an fp16 overflow would."""
    backward = Trainer.backward
    seen = []

    def overflowing(self, loss):
        backward(self, loss)
        seen.append(1)
        if len(seen) in attempts:
            next(p for p in self.params if p.grad is not None).grad.view(-1)[0] = float("inf")

    monkeypatch.setattr(Trainer, "backward", overflowing)


def test_fp16_overflows_are_skipped_counted_and_halve_the_scale(
    toy_data_bin, tmp_path, fp16_on_cpu, monkeypatch, caplog
):
    overflow_on(monkeypatch, {2, 3, 6})
    with caplog.at_level(logging.INFO, logger="nmt_cli"):
        trainer = train(
            tiny_train_config(toy_data_bin, tmp_path, max_update=5, precision="fp16", log_interval=1),
            ARCHITECTURES["transformer_tiny"],
            SearchConfig(),
        ).trainer
    ckpt = load_checkpoint(tmp_path / "checkpoint_last.pt")
    n = ckpt["train_state"]["n_overflows"]
    assert ckpt["update"] == 5 and n >= 3  # the 3 injected, and any real CPU float16 overflow
    assert ckpt["train_state"]["n_skipped_updates"] == n
    assert trainer.scaler.get_scale() == ckpt["grad_scaler"]["scale"] == 128.0 / 2**n  # fairseq's initial scale
    assert caplog.text.count("fp16 overflow at update") == n
    assert f"fp16_overflows {n}" in caplog.text  # in the train log line
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_fp16_stops_at_the_minimum_loss_scale(toy_data_bin, tmp_path, fp16_on_cpu, monkeypatch):
    overflow_on(monkeypatch, set(range(1, 1000)))  # every update overflows: the scale would halve forever
    cfg = tiny_train_config(toy_data_bin, tmp_path, max_update=100, precision="fp16", min_loss_scale=1.0)
    with pytest.raises(NmtError, match=r"^minimum loss scale reached: fp16 overflowed at every scale down to 0.5 "):
        train(cfg, ARCHITECTURES["transformer_tiny"], SearchConfig())  # 128 = 2^7: the 8th overflow stops


def test_min_loss_scale_must_be_positive(toy_data_bin, tmp_path):
    with pytest.raises(ConfigError, match="--min-loss-scale"):
        tiny_train_config(toy_data_bin, tmp_path, min_loss_scale=0.0)


def test_more_threads_than_cores_warns(caplog):
    """Oversubscribed OpenMP threads take turns: --threads 1000 on 2 cores translated one sentence 37x slower (2.6 s, 0.07 s with 2)."""
    import os

    from nmt_cli.runtime import set_threads

    before = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    try:
        with caplog.at_level(logging.WARNING, logger="nmt_cli"):
            set_threads(cores)
            assert "--threads" not in caplog.text
            set_threads(cores + 1)
        assert f"--threads {cores + 1} is more than the {cores} CPU core(s)" in caplog.text
    finally:
        torch.set_num_threads(before)
