"""A corrupted checkpoint (a field of the wrong type or shape) is one `error:` line naming the file and the field,
on resume and on load for generate, never a TypeError from deep inside torch or the search."""

import re
import shutil
from dataclasses import fields

import pytest
import torch
from click.testing import CliRunner
from conftest import TINY

from nmt_cli.cli import cli
from nmt_cli.train.state import TrainState

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_weight(state):
    return next(iter(state["model"]))


# (the field the error names, how the checkpoint is corrupted): each a field that resume reads
RESUME = [
    ("rng", lambda s: s.update(rng=torch.zeros(3))),
    ("rng[0]", lambda s: s["rng"].__setitem__(0, [1, 2])),
    ("rng[0].torch", lambda s: s["rng"][0].__setitem__("torch", s["rng"][0]["torch"].long())),
    ("rng[0].torch", lambda s: s["rng"][0].__setitem__("torch", s["rng"][0]["torch"][:100])),
    ("rng[0].python", lambda s: s["rng"][0].__setitem__("python", [3, [1, 2], None])),
    ("rng[0].numpy", lambda s: s["rng"][0].__setitem__("numpy", ["MT19937", "x", 0, 0, 0.0])),
    ("rng[0].dropout", lambda s: s["rng"][0].__setitem__("dropout", {"bit_generator": "PCG64"})),
    ("optimizer", lambda s: s.update(optimizer=[1, 2])),
    ("optimizer.param_groups", lambda s: s["optimizer"].__setitem__("param_groups", "all")),
    ("optimizer.param_groups[0].params", lambda s: s["optimizer"]["param_groups"][0].__setitem__("params", "x")),
    ("optimizer.state[0]", lambda s: s["optimizer"]["state"].__setitem__(0, "moments")),
    ("grad_scaler", lambda s: s.update(grad_scaler=[1.0])),
    ("scheduler", lambda s: s.update(scheduler="noam")),
    ("world_size", lambda s: s.update(world_size=0)),
    ("train_state", lambda s: s.update(train_state=[6, 1])),
    ("train_state.update", lambda s: s["train_state"].__setitem__("update", "6")),
    ("train_state.epoch", lambda s: s["train_state"].__setitem__("epoch", 0)),
    ("train_state.batch_in_epoch", lambda s: s["train_state"].__setitem__("batch_in_epoch", -1)),
    ("train_state.elapsed", lambda s: s["train_state"].__setitem__("elapsed", "a while")),
    ("train_state.best", lambda s: s["train_state"].__setitem__("best", [2.5])),
    ("train_state.bad_validations", lambda s: s["train_state"].__setitem__("bad_validations", 1.5)),
    ("train_state.train_data", lambda s: s["train_state"].__setitem__("train_data", 7)),
    ("train_config", lambda s: s.update(train_config=["--max-tokens", "256"])),
    ("train_config.max_tokens", lambda s: s["train_config"].__setitem__("max_tokens", "256")),
    ("train_config.adam_betas", lambda s: s["train_config"].__setitem__("adam_betas", [0.9])),
    ("search_config.beam", lambda s: s["search_config"].__setitem__("beam", 4.5)),
    ("model_config", lambda s: s.update(model_config="transformer_tiny")),
    ("model_config.d_model", lambda s: s["model_config"].__setitem__("d_model", "32")),
    ("model_config.dropout", lambda s: s["model_config"].__setitem__("dropout", None)),
    ("model", lambda s: s.update(model=[1, 2])),
    ("model[{first}]", lambda s: s["model"].__setitem__(first_weight(s), [[0.0]])),
    ("spm_model", lambda s: s.update(spm_model="spm.model")),
    ("update", lambda s: s.update(update=-1)),
    ("epoch", lambda s: s.update(epoch="1")),
    ("source_lang", lambda s: s.update(source_lang=3)),
]


def corrupt(source, target, how):
    state = torch.load(source, weights_only=True)
    how(state)
    torch.save(state, target)
    return state


def assert_one_error_naming(result, path, field):
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (result.exception, result.output)
    text = ANSI.sub("", result.output)
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    assert errors[0].startswith(f"error: {path}: field '{field}' is "), errors[0]
    assert "(expected " in errors[0], errors[0]


@pytest.mark.parametrize("field, how", RESUME, ids=[f"{i}-{f}" for i, (f, _) in enumerate(RESUME)])
def test_resume_from_a_checkpoint_with_a_corrupted_field(field, how, tiny_checkpoint, toy_data_bin, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_checkpoint.parent / "config.json", run)
    last = run / "checkpoint_last.pt"
    state = corrupt(tiny_checkpoint, last, how)
    field = field.format(first=repr(first_weight(state)) if isinstance(state["model"], dict) else "")
    before = last.read_bytes()
    args = ["--no-progress", "train", str(toy_data_bin), "--save-dir", str(run), *TINY, "--max-update", "8"]
    result = CliRunner().invoke(cli, args)
    assert_one_error_naming(result, last, field)
    assert last.read_bytes() == before, "the checkpoint is left as it was"


GENERATE = [
    ("model_config.heads", lambda s: s["model_config"].__setitem__("heads", None)),
    ("search_config.lenpen", lambda s: s["search_config"].__setitem__("lenpen", "0.6")),
    ("model[{first}]", lambda s: s["model"].__setitem__(first_weight(s), "weights")),
    ("target_format", lambda s: s.update(target_format=["text"])),
    ("averaged_from", lambda s: s.update(averaged_from="a.pt b.pt")),
]


@pytest.mark.parametrize("field, how", GENERATE, ids=[f for f, _ in GENERATE])
def test_generate_with_a_checkpoint_with_a_corrupted_field(field, how, tiny_checkpoint, tmp_path):
    path = tmp_path / "bad.pt"
    state = corrupt(tiny_checkpoint, path, how)
    field = field.format(first=repr(first_weight(state)))
    text = tmp_path / "in.txt"
    text.write_text("1 2 3\n")
    result = CliRunner().invoke(cli, ["--no-progress", "generate", "--path", str(path), "--input", str(text)])
    assert_one_error_naming(result, path, field)


def test_the_checked_counters_are_those_of_train_state():
    """nmt_cli/checkpoint checks train_state's counters by a table of its own (it cannot import train/): the same names."""
    from nmt_cli.checkpoint.checks import TRAIN_STATE_FIELDS

    assert set(TRAIN_STATE_FIELDS) == {f.name for f in fields(TrainState)}


def test_an_intact_checkpoint_still_resumes(tiny_checkpoint, toy_data_bin, tmp_path):
    shutil.copytree(tiny_checkpoint.parent, tmp_path / "run")
    args = ["--no-progress", "train", str(toy_data_bin), "--save-dir", str(tmp_path / "run"), *TINY]
    result = CliRunner().invoke(cli, [*args, "--max-update", "7"])
    assert result.exit_code == 0, result.output
    assert "resuming from" in result.output


def test_a_damaged_training_state_still_translates(tiny_checkpoint, tmp_path):
    """Only resume reads the training keys: generate takes a checkpoint whose random streams are damaged."""
    path = tmp_path / "bad-rng.pt"
    corrupt(tiny_checkpoint, path, lambda s: s.update(rng=torch.zeros(3)))
    text = tmp_path / "in.txt"
    text.write_text("1 2 3\n")
    result = CliRunner().invoke(cli, ["--no-progress", "generate", "--path", str(path), "--input", str(text)])
    assert result.exit_code == 0, result.output
