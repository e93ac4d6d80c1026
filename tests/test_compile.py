"""`nmt train --compile`: torch.compile over each layer of the model, a runtime choice the checkpoint does not keep."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import TINY, tiny_train_config

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.cli import cli
from nmt_cli.config import SearchConfig, model_config

COMMON = [*TINY, "--dropout", "0"]  # dropout off: compiled and eager runs draw different random numbers


def test_compile_is_a_train_option():
    r = CliRunner().invoke(cli, ["train", "--help"])
    assert r.exit_code == 0 and "--compile" in r.output


def test_a_compiled_trainer_saves_the_plain_modules_state(toy_data_bin, tmp_path):
    """No `_orig_mod.` prefixes, and no trace of --compile in the checkpoint (building compiles nothing yet)."""
    import torch

    from nmt_cli.commands.train import prepare

    (tmp_path / "run").mkdir()
    trainer = prepare(
        tiny_train_config(toy_data_bin, tmp_path / "run", compile=True),
        model_config("transformer_tiny"),
        SearchConfig(),
    )
    layers = [*trainer.model.encoder, *trainer.model.decoder]
    assert all(layer._compiled_call_impl is not None for layer in layers)  # each layer, in place
    assert not isinstance(trainer.synced_objective, torch._dynamo.eval_frame.OptimizedModule)
    ckpt = trainer.checkpoint()
    assert set(ckpt["model"]) == set(trainer.model.state_dict()) and not any("_orig_mod" in k for k in ckpt["model"])
    assert "compile" not in ckpt["train_config"]


def train(data_bin, save_dir, *extra, env=None):
    cmd = [sys.executable, "-m", "nmt_cli", "train", str(data_bin), "--save-dir", str(save_dir), *COMMON, *extra]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def train_losses(log_file):
    return [r["loss"] for r in map(json.loads, log_file.read_text().splitlines()) if r["event"] == "train"]


@pytest.mark.slow
def test_compiled_training_matches_eager_without_recompiling_per_batch(toy_data_bin, tmp_path):
    """24 updates (batches of 1 to 85 sentences, many lengths) compiled and eager give the same losses
    (relative 1e-4 in float32); the encoder and decoder layers are compiled a bounded number of times, not
    per batch (dynamic shapes; again for single-sentence batches, whose size 1 PyTorch specialises, and
    for validation's eval mode); the checkpoint resumes and translates without --compile. About 1 to 2
    minutes on 2 busy CPU cores, most of it compiling."""
    updates = ["--max-update", "24"]
    train(toy_data_bin, tmp_path / "eager", *updates, "--log-file", tmp_path / "eager.jsonl")
    env = {**os.environ, "TORCH_LOGS": "recompiles", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    compiled = train(
        toy_data_bin, tmp_path / "compiled", *updates, "--compile", "--log-file", tmp_path / "c.jsonl", env=env
    )
    assert compiled.stderr.count("compiling the model's layers (first updates are slow)") == 1
    assert compiled.stderr.count("Recompiling function") <= 6, compiled.stderr[-3000:]
    eager_losses, compiled_losses = train_losses(tmp_path / "eager.jsonl"), train_losses(tmp_path / "c.jsonl")
    assert len(eager_losses) == len(compiled_losses) == 24
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4)

    resumed = train(toy_data_bin, tmp_path / "compiled", "--max-update", "26")  # --compile is not remembered
    assert "resuming from" in resumed.stderr and "compiling the model" not in resumed.stderr
    ckpt = load_checkpoint(tmp_path / "compiled" / "checkpoint_last.pt")
    assert ckpt["update"] == 26 and "compile" not in ckpt["train_config"]
    r = CliRunner().invoke(
        cli, ["generate", "--path", str(tmp_path / "compiled" / "checkpoint_last.pt"), "--input", "-"], input="1 2 3\n"
    )
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 1
