"""A stop signal during a validation pass (the loss pass or the BLEU pass) abandons it: `nmt train` saves
checkpoint_last.pt at the last update and exits within seconds, and the same command resumes, validating first, to
the weights of a run that was never stopped."""

import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ONE_ROUTE, TINY, nmt

from nmt_cli.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

# `nmt train` whose validation pass (the one named by its first argument) says so on stderr, then takes a minute:
# a large valid set, as the signal would find it.
SLOW_VALIDATION = """
import sys, time
import torch
import nmt_cli.train.validation as validation
slow = sys.argv.pop(1)
def slowly(real, name):
    def run(*args, **kwargs):
        if name == slow and torch.is_inference_mode_enabled():
            print("slow validation pass", file=sys.stderr, flush=True)
            time.sleep(60)
        return real(*args, **kwargs)
    return run
validation.Trainer.batch_loss = slowly(validation.Trainer.batch_loss, "loss")
validation.translate = slowly(validation.translate, "bleu")
from nmt_cli.cli import main
sys.argv[0] = "nmt"
main()
"""


@ONE_ROUTE  # the subject is a signal and the saves it leads to, whatever route the products take
def test_a_signal_during_validation_abandons_it_and_the_same_command_resumes_exactly(toy_data_bin, tmp_path):
    args = ["train", toy_data_bin, *TINY, "--max-update", 5, "--dropout", 0.1, "--validate-interval-updates", 3]
    args += ["--save-interval-updates", 3, "--eval-bleu", "--eval-bleu-beam", 1, "--eval-bleu-max-len-b", 5]
    ref = nmt(*args, "--save-dir", tmp_path / "ref")
    assert ref.exit_code == 0, ref.output
    for slow in ("loss", "bleu"):
        run = tmp_path / slow
        stop_during_validation(slow, [*map(str, args), "--save-dir", str(run)])
        stopped = load_checkpoint(run / "checkpoint_last.pt")
        assert stopped["update"] == 3 and stopped["train_state"]["validation_due"], stopped["train_state"]
        assert not (run / "checkpoint_3.pt").exists() and not (run / "checkpoint_best.pt").exists()
        resumed = nmt(*args, "--save-dir", run)
        assert resumed.exit_code == 0, resumed.output
        for name in ("checkpoint_3.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
            a, b = load_checkpoint(tmp_path / "ref" / name), load_checkpoint(run / name)
            assert a["update"] == b["update"], (slow, name)
            assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), (slow, name)
            moments = zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values())
            assert all(torch.equal(x[k], y[k]) for x, y in moments for k in x), (slow, name)
            same = ("best", "bad_validations", "batch_in_epoch", "validation_due")
            assert {k: a["train_state"][k] for k in same} == {k: b["train_state"][k] for k in same}, (slow, name)


def stop_during_validation(slow: str, args: list[str]) -> None:
    """Run `nmt train ARGS` with its `slow` validation pass slow, SIGTERM it there; it exits as stopped within 10 s."""
    cmd = [sys.executable, "-c", SLOW_VALIDATION, slow, "--no-progress", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stderr:
            if "slow validation pass" in line:
                sent = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.communicate(timeout=30)[1]
    finally:
        proc.kill()  # one that waits for its pass to end would take minutes
    assert proc.returncode == 128 + signal.SIGTERM, rest
    assert time.monotonic() - sent < 10, rest
    assert "stopped by SIGTERM; the same command resumes" in rest
