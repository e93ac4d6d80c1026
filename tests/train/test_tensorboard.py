"""`nmt train --tensorboard-logdir`: the logged metrics as TensorBoard scalars, read back with TensorBoard's own
reader; a resumed run continues the same curves."""

import sys

import pytest
from conftest import ONE_ROUTE, TINY, nmt

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@ONE_ROUTE  # the subject is what is logged where, whatever route the products take
def test_train_and_valid_scalars_by_update_and_a_resumed_run_continues_them(toy_data_bin, tmp_path):
    board = tmp_path / "board"
    args = ["train", toy_data_bin, "--save-dir", tmp_path / "ck", *TINY, "--tensorboard-logdir", board]
    args += ["--validate-interval-updates", 2, "--eval-bleu", "--eval-bleu-beam", 1]
    result = nmt(*args, "--max-update", 4)
    assert result.exit_code == 0, result.output
    first = scalars(board)
    assert {"train/loss", "train/nll_loss", "train/ppl", "train/lr", "train/grad_norm", "train/tgt_tok_per_s"} <= set(
        first
    )
    assert {"valid/loss", "valid/nll", "valid/ppl", "valid/bleu", "valid/best"} <= set(first)
    assert [step for step, _ in first["train/loss"]] == [1, 2, 3, 4]
    assert [step for step, _ in first["valid/loss"]] == [2, 4]
    assert all(value > 0 for _, value in first["train/lr"])
    result = nmt(*args, "--max-update", 6)
    assert result.exit_code == 0, result.output
    resumed = scalars(board)
    assert resumed["train/loss"][:4] == first["train/loss"]
    assert [step for step, _ in resumed["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in resumed["valid/bleu"]] == [2, 4, 6]


@ONE_ROUTE  # the subject is a missing package, whatever route the products take
def test_without_tensorboard_one_error_line_says_how_to_install_it(toy_data_bin, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # an import of it fails
    args = ["train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 1]
    result = nmt(*args, "--tensorboard-logdir", tmp_path / "board")
    assert result.exit_code == 1, result.output
    assert "error: --tensorboard-logdir needs tensorboard: pip install 'nmt[tensorboard]'" in result.output
