"""--ema-decay: the moving average of the weights, its updates, exact resume, validation on it, and the commands
that read checkpoints (generate, average-checkpoints) using it."""

import json

import pytest
import torch
from conftest import TINY, nmt, tiny_train_config

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.checkpoint.saved import read_saved_model
from nmt_cli.commands.average import average_checkpoints
from nmt_cli.config import ARCHITECTURES, SearchConfig
from nmt_cli.signals import Deferred
from nmt_cli.train.ema import WeightAverage
from nmt_cli.train.validation import validate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_the_average_copies_the_weights_until_its_start_then_moves_by_the_decay(tiny_model):
    average = WeightAverage(tiny_model, decay=0.75, start_update=2)
    weights = list(tiny_model.parameters())
    with torch.no_grad():
        weights[0].add_(1.0)
    average.update(1)  # before --ema-start-update: a copy
    assert all(torch.equal(a, w) for a, w in zip(average.model.parameters(), weights))
    before = weights[0].detach().clone()
    with torch.no_grad():
        weights[0].add_(4.0)
    average.update(2)
    assert torch.allclose(next(average.model.parameters()), 0.75 * before + 0.25 * weights[0])
    assert (
        next(average.model.parameters()).dtype == torch.float32 and not next(average.model.parameters()).requires_grad
    )
    tied = {name for name, _ in average.model.named_parameters(remove_duplicate=False)} - set(average.state_dict())
    assert not tied  # every name of the model's state, the tied weights under each of theirs


def test_resume_with_the_average_is_exact(toy_data_bin, tmp_path):
    """Stopped at update 3 and resumed, a run ends with the weights and the average bit for bit as one that ran on."""
    base = ["train", toy_data_bin, *TINY, "--ema-decay", 0.9, "--ema-start-update", 2]
    assert nmt(*base, "--save-dir", tmp_path / "on", "--max-update", 6).exit_code == 0
    assert nmt(*base, "--save-dir", tmp_path / "stopped", "--max-update", 3).exit_code == 0
    assert nmt(*base, "--save-dir", tmp_path / "stopped", "--max-update", 6).exit_code == 0
    on, stopped = (load_checkpoint(tmp_path / run / "checkpoint_last.pt") for run in ("on", "stopped"))
    assert on["update"] == stopped["update"] == 6
    for key in ("model", "ema"):
        assert all(torch.equal(on[key][k], stopped[key][k]) for k in on[key]), key
    assert not all(torch.equal(on["model"][k], on["ema"][k]) for k in on["model"])
    assert on["ema"]["encoder.0.ffn.fc1.weight"].dtype == torch.float32
    # translating reads the average; averaging checkpoints averages theirs
    assert all(
        torch.equal(w, on["ema"][k])
        for k, w in read_saved_model(tmp_path / "on" / "checkpoint_last.pt").weights.items()
    )
    both = average_checkpoints([tmp_path / "on" / "checkpoint_last.pt", tmp_path / "stopped" / "checkpoint_3.pt"])
    third = load_checkpoint(tmp_path / "stopped" / "checkpoint_3.pt")["ema"]
    name = "decoder.1.ffn.fc2.weight"
    assert torch.allclose(both["model"][name], (on["ema"][name] + third[name]) / 2)


def test_validation_measures_the_average(toy_data_bin, tmp_path):
    from nmt_cli.commands.train import train

    log = tmp_path / "log.jsonl"
    cfg = tiny_train_config(toy_data_bin, tmp_path, max_update=4, ema_decay=0.5, log_file=str(log))
    trainer = train(cfg, ARCHITECTURES["transformer_tiny"], SearchConfig()).trainer
    logged = [json.loads(line) for line in log.read_text().splitlines() if '"valid"' in line][-1]["valid_loss"]
    assert validate(trainer, Deferred(""))["valid_loss"] == logged
    ema, trainer.ema = trainer.ema, None
    assert validate(trainer, Deferred(""))["valid_loss"] != logged  # the raw weights measure otherwise
    trainer.model.load_state_dict(ema.state_dict())
    assert validate(trainer, Deferred(""))["valid_loss"] == logged


def test_ema_start_update_needs_ema_decay(toy_data_bin, tmp_path):
    result = nmt("train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 1, "--ema-start-update", 5)
    assert result.exit_code == 1 and "error: --ema-start-update needs --ema-decay" in result.output


def test_a_damaged_average_is_one_error_naming_the_field(toy_data_bin, tmp_path):
    assert (
        nmt("train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 1, "--ema-decay", 0.9).exit_code == 0
    )
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)
    state["ema"] = {"encoder.0.ffn.fc1.weight": torch.zeros(1)}
    torch.save(state, tmp_path / "damaged.pt")
    result = nmt("generate", "--path", tmp_path / "damaged.pt", "--input", "-", input="1 2\n")
    assert result.exit_code == 1, result.output
    assert f"error: {tmp_path / 'damaged.pt'}: field 'ema' is a dict" in result.output
