"""Data-parallel training on CPU with gloo and 2 processes under torchrun."""

import subprocess
import sys

import pytest
import torch

from nmt_cli.checkpoint import load_checkpoint

COMMON = ["--arch", "transformer_tiny", "--max-tokens", "256", "--warmup-updates", "4", "--device", "cpu",
          "--threads", "1", "--dropout", "0", "--log-interval", "1"]


def nmt(data_bin, save_dir, *extra, ranks=1):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                "--standalone"] if ranks > 1 else [sys.executable]
    cmd = [*launcher, "-m", "nmt_cli", "train", str(data_bin), "--save-dir", str(save_dir), *COMMON, *extra]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def assert_same_parameters(a, b, atol):
    for name, tensor in a["model"].items():
        torch.testing.assert_close(tensor, b["model"][name], atol=atol, rtol=0, msg=name)


def test_two_ranks_equal_one_process_with_update_freq_2(toy_data_bin, tmp_path):
    nmt(toy_data_bin, tmp_path / "single", "--max-update", "4", "--update-freq", "2")
    two = nmt(toy_data_bin, tmp_path / "ddp", "--max-update", "4", ranks=2)
    single = load_checkpoint(tmp_path / "single" / "checkpoint_last.pt")
    ddp = load_checkpoint(tmp_path / "ddp" / "checkpoint_last.pt")
    assert single["update"] == ddp["update"] == 4 and ddp["world_size"] == 2
    assert_same_parameters(single, ddp, atol=1e-5)
    assert two.stderr.count("train | update 1 ") == 1  # only rank 0 logs


def test_two_ranks_resume_and_finish(toy_data_bin, tmp_path):
    nmt(toy_data_bin, tmp_path / "whole", "--max-update", "6", ranks=2)
    nmt(toy_data_bin, tmp_path / "parts", "--max-update", "3", ranks=2)
    resumed = nmt(toy_data_bin, tmp_path / "parts", "--max-update", "6", ranks=2)
    assert "resuming from" in resumed.stderr
    assert_same_parameters(load_checkpoint(tmp_path / "whole" / "checkpoint_last.pt"),
                           load_checkpoint(tmp_path / "parts" / "checkpoint_last.pt"), atol=0)


def test_two_ranks_killed_after_a_checkpoint_resume_and_finish(toy_data_bin, tmp_path):
    import signal
    import time

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "nmt_cli",
           "train", str(toy_data_bin), "--save-dir", str(tmp_path), *COMMON, "--max-update", "300",
           "--save-interval-updates", "3"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        if "saved checkpoint_last.pt at update 3" in line:
            # The launcher, and the ranks (torchrun starts them in sessions of their own).
            subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)], check=False)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).returncode == 1, "a rank survived"
    assert not (tmp_path / "checkpoint_300.pt").exists()
    killed_at = load_checkpoint(tmp_path / "checkpoint_last.pt")["update"]
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at update {killed_at}" in resumed.stderr
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["update"] == 300
