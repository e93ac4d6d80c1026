"""The fault suite's standard output, one way for every command: closed or full, one `error:` line."""

import pytest
import torch

pytest.register_assert_rewrite("fault_checks")  # before the import, so that its asserts show their values
from fault_checks import assert_clean_failure, nmt_subprocess

pytest_plugins = ["fault_checks"]  # its fixtures: work, other_data_bin


@pytest.mark.parametrize("redirect,expected", [(" >/dev/full", "No space left on device"), (" >&-", "is closed")])
@pytest.mark.parametrize("command", ["help", "score", "generate"])
def test_a_closed_or_full_stdout_is_one_error_line(command, redirect, expected, tiny_checkpoint, tmp_path):
    (tmp_path / "text").write_text("1 2 3\n4 5\n")
    args = {
        "help": ["--help"],
        "score": ["score", "--sys", tmp_path / "text", "--ref", tmp_path / "text"],
        "generate": ["generate", "--path", tiny_checkpoint, "--input", tmp_path / "text", "--threads", 1],
    }[command]
    r = nmt_subprocess(*args, shell_suffix=redirect)
    assert_clean_failure(r.returncode, r.stderr.decode(), "standard output", tmp_path)
    assert expected in r.stderr.decode()


def test_a_closed_stdout_is_no_error_for_a_command_that_prints_nothing(work):
    inputs = [work / "run" / "checkpoint_4.pt", work / "run" / "checkpoint_6.pt"]
    r = nmt_subprocess("average-checkpoints", "--inputs", *inputs, "--output", work / "avg.pt", shell_suffix=" >&-")
    assert r.returncode == 0, r.stderr.decode()
    assert torch.load(work / "avg.pt", weights_only=True)["averaged_from"] == [str(p) for p in inputs]
