"""The fault suite for `nmt average-checkpoints`: bad inputs and outputs, a full disk, a signal, and a training
state never replaced unasked."""

import shutil
import signal

import pytest
import torch
from conftest import TINY

pytest.register_assert_rewrite("fault_checks")  # before the import, so that its asserts show their values
from fault_checks import (
    assert_clean_failure,
    check_fault_in_process,
    driven,
    error_lines,
    full_disk_after,
    nmt,
    reversed_data,
    snapshot,
)

pytest_plugins = ["fault_checks"]  # its fixtures: work, other_data_bin


def train_on(name, make_data=None):
    """A setup that trains 2 updates on work/<name> (made by make_data first) into work/run-<name>."""

    def setup(work):
        if make_data is not None:
            make_data(work)
        assert nmt("train", work / name, "--save-dir", work / f"run-{name}", *TINY, "--max-update", 2).exit_code == 0

    return setup


# (id, setup(work) or None, args (strings with {w} for the work dir, {other} for other_data_bin), expected)
CASES = [
    (
        "average-checkpoints-of-another-vocabulary",
        train_on("other"),
        "average-checkpoints --inputs {w}/run/checkpoint_last.pt {w}/run-other/checkpoint_last.pt --output {w}/a.pt",
        "have different sentencepiece models",
    ),
    (
        "average-checkpoints-of-the-other-direction",
        train_on("reversed", reversed_data),
        "average-checkpoints --inputs {w}/run/checkpoint_last.pt {w}/run-reversed/checkpoint_last.pt --output {w}/a.pt",
        "translate src->tgt and tgt->src",
    ),
    (
        "average-files-with-num-update-checkpoints",
        None,
        "average-checkpoints --inputs {w}/run/checkpoint_2.pt {w}/run/checkpoint_4.pt --num-update-checkpoints 5 "
        "--output {w}/a.pt",
        "--num-update-checkpoints picks the newest checkpoints of one --inputs directory",
    ),
    (
        "average-output-is-a-data-file",  # replaced a data directory's spm.model with a checkpoint before
        None,
        "average-checkpoints --inputs {w}/run/checkpoint_2.pt {w}/run/checkpoint_4.pt --output {w}/data/spm.model",
        "exists and is not an nmt checkpoint",
    ),
    (
        "average-output-is-an-input",
        None,
        "average-checkpoints --inputs {w}/run/checkpoint_2.pt {w}/run/checkpoint_4.pt --output {w}/run/checkpoint_4.pt",
        "is one of the checkpoints being averaged",
    ),
    (
        "average-output-is-a-symlink-to-an-input",
        lambda w: (w / "link.pt").symlink_to(w / "run" / "checkpoint_4.pt"),
        "average-checkpoints --inputs {w}/run/checkpoint_4.pt {w}/run/checkpoint_6.pt --output {w}/link.pt",
        "is one of the checkpoints being averaged",
    ),
    (
        "average-output-is-checkpoint-last",
        None,
        "average-checkpoints --inputs {w}/run/checkpoint_4.pt {w}/run/checkpoint_6.pt --output {w}/run/checkpoint_last.pt",
        "is a name training writes",
    ),
    (
        "average-output-is-checkpoint-best",
        None,
        "average-checkpoints --inputs {w}/run/checkpoint_4.pt {w}/run/checkpoint_6.pt --output {w}/x/checkpoint_best.pt",
        "is a name training writes",
    ),
    (
        "average-input-missing",  # had been click's usage text, exit 2
        None,
        "average-checkpoints --inputs {w}/run/none.pt {w}/run/checkpoint_4.pt --output {w}/avg.pt",
        "error: --inputs ",  # and the path: "... does not exist"
    ),
    (
        "average-more-inputs-missing",
        None,
        "average-checkpoints --inputs {w}/run/checkpoint_4.pt {w}/run/none.pt --output {w}/avg.pt",
        "error: MORE_INPUTS ",
    ),
    (
        "average-input-not-a-checkpoint",
        lambda w: (w / "junk.pt").write_bytes(b"junk"),
        "average-checkpoints --inputs {w}/junk.pt {w}/run/checkpoint_6.pt --output {w}/avg.pt",
        "not a readable nmt checkpoint",
    ),
]


@pytest.mark.parametrize("case_id,setup,args,expected", CASES, ids=[c[0] for c in CASES])
def test_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus):
    check_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus)


def test_full_disk_while_averaging(work, monkeypatch):
    monkeypatch.setattr(torch, "save", full_disk_after(100))
    r = nmt(
        "average-checkpoints",
        "--inputs",
        work / "run" / "checkpoint_4.pt",
        work / "run" / "checkpoint_6.pt",
        "--output",
        work / "avg.pt",
    )
    assert_clean_failure(
        r.exit_code, r.output, f"no space left on device writing {work / 'avg.pt'}", work, exception=r.exception
    )
    assert not (work / "avg.pt").exists()


# torch.save into a file whose first write signals the process: the signal arrives inside torch's zip writer
SIGNAL_IN_TORCH_SAVE = """
real_save = torch.save
class Signalling:
    def __init__(self, f): self.f = f
    def write(self, data):
        n = self.f.write(data)
        os.kill(os.getpid(), SIG)
        time.sleep(0.01)  # the handler runs before this write returns, whichever thread took the signal
        return n
    def flush(self): self.f.flush()
torch.save = lambda obj, f, *a, **k: real_save(obj, Signalling(f), *a, **k)
"""


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_while_averaging_stops_cleanly(signal_name, work):
    before = snapshot(work)
    inputs = [work / "run" / "checkpoint_4.pt", work / "run" / "checkpoint_6.pt"]
    r = driven(
        SIGNAL_IN_TORCH_SAVE, signal_name, "average-checkpoints", "--inputs", *inputs, "--output", work / "avg.pt"
    )
    assert_clean_failure(r.returncode, r.stderr.decode(), f"stopped by {signal_name}", work, before)
    assert r.returncode == 128 + getattr(signal, signal_name), "exits as an interrupted program does"
    assert "inline_container" not in r.stderr.decode()
    assert not (work / "avg.pt").exists()


def test_average_keeps_a_resumable_checkpoint_unless_forced(work):
    backup = work / "backup.pt"
    shutil.copy(work / "run" / "checkpoint_last.pt", backup)
    before = snapshot(work)
    inputs = ["--inputs", work / "run" / "checkpoint_4.pt", work / "run" / "checkpoint_6.pt"]
    r = nmt("average-checkpoints", *inputs, "--output", backup)
    assert_clean_failure(r.exit_code, r.output, f"--output {backup} holds a training state", work, before, r.exception)
    assert "--force" in error_lines(r.output)[0]
    assert nmt("average-checkpoints", *inputs, "--output", backup, "--force").exit_code == 0
    assert "optimizer" not in torch.load(backup, weights_only=True)
    assert nmt("average-checkpoints", *inputs, "--output", backup).exit_code == 0, "an average is replaced freely"
