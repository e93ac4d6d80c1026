"""Attention kernels chosen on purpose: `nmt train` and `nmt generate` set SDPA's backends as they start, cuDNN's
off unless --cudnn-attention (runtime.choose_attention_backends). The kernels themselves run in tests/test_gpu.py."""

import logging

import pytest
import torch
from click.testing import CliRunner
from conftest import TINY

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.cli import cli
from nmt_cli.runtime import choose_attention_backends

BACKENDS = ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_math_sdp", "enable_cudnn_sdp")


@pytest.fixture
def backend_calls(monkeypatch):
    """Every call to torch.backends.cuda.enable_*_sdp, as (name, value), instead of setting the flags."""
    calls = []
    for name in BACKENDS:
        monkeypatch.setattr(torch.backends.cuda, name, lambda on, name=name: calls.append((name, on)))
    return calls


def test_cudnn_attention_is_off_unless_asked_and_the_choice_is_logged_once_on_cuda(backend_calls, caplog):
    with caplog.at_level(logging.INFO, logger="nmt_cli.runtime"):
        choose_attention_backends(torch.device("cuda", 0), False)
    assert backend_calls == [(name, name != "enable_cudnn_sdp") for name in BACKENDS]
    assert [r.getMessage() for r in caplog.records] == [
        "attention runs on flash, memory-efficient or math kernels (cuDNN's: --cudnn-attention)"
    ]
    backend_calls.clear()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nmt_cli.runtime"):
        choose_attention_backends(torch.device("cuda", 0), True)
        choose_attention_backends(torch.device("cpu"), False)  # set alike, but not said on CPU
    assert ("enable_cudnn_sdp", True) in backend_calls and ("enable_cudnn_sdp", False) in backend_calls
    assert len(caplog.records) == 1 and "--cudnn-attention" in caplog.records[0].getMessage()


@pytest.mark.parametrize("extra, cudnn", [([], False), (["--cudnn-attention"], True)])
def test_train_sets_the_backends_as_it_starts_and_does_not_save_the_choice(
    toy_data_bin, tmp_path, backend_calls, extra, cudnn
):
    save = tmp_path / "run"
    r = CliRunner().invoke(
        cli, ["train", str(toy_data_bin), "--save-dir", str(save), *TINY, "--max-update", "1", *extra]
    )
    assert r.exit_code == 0, r.output
    assert backend_calls.count(("enable_cudnn_sdp", cudnn)) == 1 and len(backend_calls) == len(BACKENDS)
    assert "cudnn_attention" not in load_checkpoint(save / "checkpoint_last.pt")["train_config"]


@pytest.mark.parametrize("extra, cudnn", [([], False), (["--cudnn-attention"], True)])
def test_generate_sets_the_backends_as_it_starts(tiny_checkpoint, backend_calls, extra, cudnn):
    r = CliRunner().invoke(
        cli, ["generate", "--path", str(tiny_checkpoint), "--input", "-", "--device", "cpu", *extra], input="1 2 3\n"
    )
    assert r.exit_code == 0, r.output
    assert backend_calls.count(("enable_cudnn_sdp", cudnn)) == 1 and len(backend_calls) == len(BACKENDS)
