"""`nmt train` and `nmt average-checkpoints` through the CLI: outputs, exact resume, signals, bad input."""

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ONE_ROUTE, TINY, nmt

from nmt_cli.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_train_writes_checkpoints_logs_and_config(toy_data_bin, tmp_path):
    save = tmp_path / "ck"
    result = nmt(
        "train",
        toy_data_bin,
        "--save-dir",
        save,
        *TINY,
        "--max-update",
        6,
        "--save-interval-updates",
        2,
        "--keep-last",
        2,
        "--log-file",
        tmp_path / "log.jsonl",
        "--validate-interval-updates",
        3,
    )
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in save.iterdir())
    assert names == ["checkpoint_4.pt", "checkpoint_6.pt", "checkpoint_best.pt", "checkpoint_last.pt", "config.json"]
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in records if r["event"] == "train"]
    assert [r["update"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert {"loss", "nll_loss", "ppl", "tgt_tok_per_s", "lr", "grad_norm", "elapsed_s"} <= set(train[0])
    assert any(r["event"] == "valid" and "valid_loss" in r for r in records)
    state = torch.load(save / "checkpoint_last.pt", weights_only=True)
    assert state["update"] == 6 and state["spm_model"] == (toy_data_bin / "spm.model").read_bytes()
    assert "parameters" in result.output


def test_rerunning_a_finished_run_is_a_noop(toy_data_bin, tmp_path):
    args = ["train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 2]
    assert nmt(*args).exit_code == 0
    before = (tmp_path / "checkpoint_last.pt").stat().st_mtime_ns
    result = nmt(*args)
    assert result.exit_code == 0 and "nothing to do" in result.output
    assert (tmp_path / "checkpoint_last.pt").stat().st_mtime_ns == before


@ONE_ROUTE  # the subject is the stopping rules and the saves they lead to
def test_max_epoch_and_patience(toy_data_bin, tmp_path):
    log = tmp_path / "log.jsonl"
    result = nmt(
        "train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-tokens", 4096, "--max-epoch", 2, "--log-file", log
    )
    assert result.exit_code == 0, result.output
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["epoch"] == 3  # the next epoch to run
    assert "epoch 2 after" in result.output and "reached --max-epoch 2" in result.output
    # the validation at an epoch's end is logged under that epoch, as fairseq does, not the next one
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["epoch"] for r in records if r["event"] == "valid"] == [1, 2]
    # one save per epoch's end, the last numbered: checkpoint_last.pt is not written a second time after the loop
    saves = [line for line in result.output.splitlines() if "saved checkpoint_last.pt" in line]
    assert len(saves) == 2 and "checkpoint_5.pt" not in saves[0] and "checkpoint_10.pt" in saves[1], saves


def test_resuming_with_other_batches_restarts_the_epoch(toy_data_bin, tmp_path):
    """Another --max-tokens or --seed batches the epoch differently: the saved position would point into other
    batches (pairs seen twice or not at all), so the epoch restarts, with a warning."""
    assert nmt("train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 2).exit_code == 0
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]["batch_in_epoch"] == 2
    result = nmt("train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 3, "--max-tokens", 300)
    assert result.exit_code == 0, result.output
    assert "--max-tokens 300 (was 256): the epoch's batches differ, so the data iterator restarts" in result.output
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]["batch_in_epoch"] == 1


def train_subprocess(data_bin, save_dir, *extra, arch="transformer_small"):
    cmd = [
        sys.executable,
        "-m",
        "nmt_cli",
        "--no-progress",
        "train",
        str(data_bin),
        "--save-dir",
        str(save_dir),
        "--arch",
        arch,
        "--max-tokens",
        "1024",
        "--warmup-updates",
        "4",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--log-interval",
        "1",
        "--dropout",
        "0.1",
        "--max-update",
        "8",
        "--save-interval-updates",
        "4",
        *extra,
    ]
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


@pytest.mark.slow  # runs three or more processes (10-25 s); make test-all
def test_sigkill_and_resume_is_bit_identical(toy_data_bin, tmp_path):
    ref = train_subprocess(toy_data_bin, tmp_path / "ref")
    assert ref.wait(timeout=120) == 0, ref.stderr.read()
    killed = train_subprocess(toy_data_bin, tmp_path / "run")
    for line in killed.stderr:
        if "saved checkpoint_last.pt at update 4" in line:
            killed.send_signal(signal.SIGKILL)
            break
    killed.wait(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "run" / "checkpoint_8.pt").exists(), "the run finished before it could be killed"
    resumed = train_subprocess(toy_data_bin, tmp_path / "run")
    out = resumed.communicate(timeout=120)[1]
    assert resumed.returncode == 0, out
    assert "resuming from" in out and "at update 4" in out
    a = load_checkpoint(tmp_path / "ref" / "checkpoint_last.pt")
    b = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    assert a["update"] == b["update"] == 8
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for (ka, va), (kb, vb) in zip(a["optimizer"]["state"].items(), b["optimizer"]["state"].items()):
        assert all(torch.equal(va[k], vb[k]) for k in va)


@ONE_ROUTE  # the subject is the signal and the save it leads to, whatever route the products take
def test_sigterm_saves_and_exits_as_interrupted(toy_data_bin, tmp_path):
    """Saved, then exit code 143 (128 + SIGTERM): with 0, a recipe went on to average, translate and score the
    half-trained model (and table3 marked the row done)."""
    proc = train_subprocess(toy_data_bin, tmp_path, "--max-update", "100000", arch="transformer_tiny")
    for line in proc.stderr:
        if "update 2 " in line:
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 128 + signal.SIGTERM, rest
    assert "stopped by SIGTERM; the same command resumes" in rest
    assert 2 <= load_checkpoint(tmp_path / "checkpoint_last.pt")["update"] < 100


# `nmt train` that signals itself as a user who presses Ctrl-C again and again while the last save is written (and a
# job scheduler that sends SIGTERM meanwhile): SIGINT after update 3, then at each of the first three writes of every
# checkpoint saved after that SIGTERM, SIGINT, SIGTERM.
SIGNALS_IN_THE_LAST_SAVE = """
import os, signal, sys, time
import torch
import nmt_cli.train.trainer as trainer_module
sent = []
real_step = trainer_module.Trainer.train_step
def train_step(self, *args, **kwargs):
    stats = real_step(self, *args, **kwargs)
    if self.state.update == 3 and not sent:
        sent.append(signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    return stats
trainer_module.Trainer.train_step = train_step
real_save = torch.save
class Signalling:
    def __init__(self, f): self.f, self.n = f, 0
    def write(self, data):
        if sent and self.n < 3:
            self.n += 1
            os.kill(os.getpid(), (signal.SIGTERM, signal.SIGINT)[self.n % 2 == 0])
            time.sleep(0.05)
        return self.f.write(data)
    def flush(self): self.f.flush()
torch.save = lambda obj, f, *a, **k: real_save(obj, Signalling(f), *a, **k)
from nmt_cli.cli import main
sys.argv[0] = "nmt"
main()
"""


@ONE_ROUTE  # the subject is signals during a save, whatever route the products take
def test_signals_during_the_last_save_wait_for_it(toy_data_bin, tmp_path):
    """Issue 47: further signals while the save of a stopped run was written stopped that save ("checkpoint ... was
    not written"): a fresh run kept nothing, a resumed one lost its updates since the last save. The save finishes,
    each further signal says so on one line, and the run exits as interrupted by the first."""
    args = ["train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 100, "--save-interval-updates", 2]
    cmd = [sys.executable, "-c", SIGNALS_IN_THE_LAST_SAVE, "--no-progress", *map(str, args)]
    at_terminal = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731 (a background shell ignores it)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=at_terminal)
    assert run.returncode == 128 + signal.SIGINT, run.stderr
    assert "Traceback" not in run.stderr and "error:" not in run.stderr.lower(), run.stderr
    assert "stopped by SIGINT; the same command resumes" in run.stderr
    waiting = [line for line in run.stderr.splitlines() if "stopping once checkpoint_last.pt is saved" in line]
    assert [line.split(":")[0] for line in waiting] == ["SIGTERM ignored", "SIGINT ignored", "SIGTERM ignored"]
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["update"] == 3
    assert load_checkpoint(tmp_path / "checkpoint_2.pt")["update"] == 2
    assert not list(tmp_path.glob("*.tmp"))


def test_average_refuses_the_same_weights_twice(tiny_checkpoint, tmp_path):
    """A glob such as checkpoint*.pt gives checkpoint_last.pt beside the checkpoint_<update>.pt it equals."""
    out, numbered = tmp_path / "avg.pt", tiny_checkpoint.parent / "checkpoint_6.pt"
    result = nmt("average-checkpoints", "--inputs", tiny_checkpoint, tiny_checkpoint, "--output", out)
    assert result.exit_code == 1 and f"{tiny_checkpoint} is given twice (update 6)" in result.output
    result = nmt("average-checkpoints", "--inputs", numbered, tiny_checkpoint, "--output", out)
    assert result.exit_code == 1 and f"{tiny_checkpoint} and {numbered} hold the same weights" in result.output
    assert not out.exists()


def test_average_last_n_of_a_directory(tiny_checkpoint, tmp_path):
    out = tmp_path / "avg.pt"
    result = nmt(
        "average-checkpoints", "--inputs", tiny_checkpoint.parent, "--num-update-checkpoints", 2, "--output", out
    )
    assert result.exit_code == 0, result.output
    assert [Path(p).name for p in load_checkpoint(out)["averaged_from"]] == ["checkpoint_4.pt", "checkpoint_6.pt"]
    assert "optimizer" not in load_checkpoint(out)
    a, b = (load_checkpoint(tiny_checkpoint.parent / f"checkpoint_{u}.pt")["model"] for u in (4, 6))
    name = "encoder.0.ffn.fc1.weight"
    torch.testing.assert_close(load_checkpoint(out)["model"][name], (a[name] + b[name]) / 2)
    too_many = nmt(
        "average-checkpoints", "--inputs", tiny_checkpoint.parent, "--num-update-checkpoints", 9, "--output", out
    )
    assert too_many.exit_code == 1 and "fewer than --num-update-checkpoints 9" in too_many.output


def test_resume_with_other_dropout_rates_and_average_across(toy_data_bin, tmp_path):
    """Dropout rates are regularisation, not shape (fairseq takes them from the command line on resume):
    a run continues with new rates, logged, and its checkpoints before and after average."""
    first = nmt("train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 2, "--save-interval-updates", 2)
    assert first.exit_code == 0, first.output
    args = ["train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--max-update", 4]
    result = nmt(*args, "--dropout", 0.3, "--attention-dropout", 0.1)
    assert result.exit_code == 0, result.output
    assert "option dropout differs from the checkpoint: 0.3 (was 0.1)" in result.output
    assert "option attention_dropout differs from the checkpoint: 0.1 (was 0.0)" in result.output
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["model_config"]["dropout"] == 0.3
    paths = [tmp_path / "checkpoint_2.pt", tmp_path / "checkpoint_4.pt"]
    averaged = nmt("average-checkpoints", "--inputs", *paths, "--output", tmp_path / "avg.pt")
    assert averaged.exit_code == 0, averaged.output


def test_resuming_on_other_training_data_restarts_the_epoch(toy_data_bin, toy_corpus, tmp_path):
    """The saved position points into batches made from the training split's sentence lengths: on a data
    directory with other training pairs it had gone on from the same batch index without a word."""
    from conftest import write_copy_corpus

    write_copy_corpus(tmp_path / "raw" / "train", 1500, seed=7)
    other = tmp_path / "other-bin"
    args = ["-s", "src", "-t", "tgt", "--trainpref", tmp_path / "raw" / "train", "--validpref", toy_corpus / "valid"]
    assert nmt("preprocess", *args, "--destdir", other, "--spm-model", toy_data_bin / "spm.model").exit_code == 0
    assert nmt("train", toy_data_bin, "--save-dir", tmp_path / "ck", *TINY, "--max-update", 2).exit_code == 0
    copy = tmp_path / "copy-bin"  # the same data elsewhere: the position holds
    shutil.copytree(toy_data_bin, copy)
    result = nmt("train", copy, "--save-dir", tmp_path / "ck", *TINY, "--max-update", 3)
    assert result.exit_code == 0 and "other training data" not in result.output, result.output
    assert load_checkpoint(tmp_path / "ck" / "checkpoint_last.pt")["train_state"]["batch_in_epoch"] == 3
    result = nmt("train", other, "--save-dir", tmp_path / "ck", *TINY, "--max-update", 4)
    assert result.exit_code == 0, result.output
    assert f"{other} holds other training data (its sentences' lengths differ)" in result.output
    assert load_checkpoint(tmp_path / "ck" / "checkpoint_last.pt")["train_state"]["batch_in_epoch"] == 1


def test_resuming_with_another_best_checkpoint_metric_starts_the_best_again(toy_data_bin, tmp_path):
    """A best valid loss had been compared with BLEU scores (no BLEU beat a loss of 6), and the reverse."""
    base = ["train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--validate-interval-updates", 1]
    assert nmt(*base, "--max-update", 1).exit_code == 0
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]["best_metric"] == "loss"
    bleu = ["--eval-bleu", "--best-checkpoint-metric", "bleu", "--eval-bleu-max-len-b", 3]
    result = nmt(*base, "--max-update", 2, *bleu, "--log-file", tmp_path / "log.jsonl")
    assert result.exit_code == 0, result.output
    assert "--best-checkpoint-metric bleu (was loss): the best so far" in result.output
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]
    valid = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines() if '"valid"' in line]
    assert state["best"] == valid[-1]["valid_bleu"] and state["best_metric"] == "bleu"


def test_resume_applies_new_optimizer_options_and_reset_flags_say_what_they_do(toy_data_bin, tmp_path):
    """New --adam-betas/--adam-eps/--weight-decay were logged as in use, but the optimizer's saved ones ran."""
    args = ["train", toy_data_bin, "--save-dir", tmp_path, *TINY]
    first = nmt(*args, "--max-update", 2, "--reset-optimizer", "--reset-dataloader")
    assert first.exit_code == 0, first.output
    assert (
        "--reset-optimizer and --reset-dataloader: " in first.output
        and "has no checkpoint_last.pt to reset" in first.output
    )
    result = nmt(*args, "--max-update", 3, "--adam-betas", "0.8,0.9", "--adam-eps", 1e-6, "--weight-decay", 0.01)
    assert result.exit_code == 0, result.output
    group = load_checkpoint(tmp_path / "checkpoint_last.pt")["optimizer"]["param_groups"][0]
    assert tuple(group["betas"]) == (0.8, 0.9) and group["eps"] == 1e-6 and group["weight_decay"] == 0.01
    result = nmt(*args, "--max-update", 4, "--reset-optimizer", "--reset-dataloader")
    assert (
        "--reset-optimizer: Adam's moments" in result.output
        and "--reset-dataloader: the data restarts" in result.output
    )


def test_a_reset_applies_once_so_that_the_same_command_resumes_exactly(toy_data_bin, tmp_path):
    """The --reset-* options had applied at every resume: the same command rerun after a stop restarted the lr
    schedule, Adam's moments and the data again. Stopped at update 3 and rerun, a run now ends as one that ran on."""
    base = ["train", toy_data_bin, *TINY, "--validate-interval-updates", 0]
    resets = ["--reset-lr-scheduler", "--reset-optimizer", "--reset-dataloader"]
    for run in ("on", "stopped"):
        assert nmt(*base, "--save-dir", tmp_path / run, "--max-update", 2).exit_code == 0
    assert nmt(*base, "--save-dir", tmp_path / "on", "--max-update", 4, *resets).exit_code == 0
    assert nmt(*base, "--save-dir", tmp_path / "stopped", "--max-update", 3, *resets).exit_code == 0
    again = nmt(*base, "--save-dir", tmp_path / "stopped", "--max-update", 4, *resets)
    assert again.exit_code == 0 and "applied when this run began; not again at this resume" in again.output
    on, stopped = (load_checkpoint(tmp_path / run / "checkpoint_last.pt") for run in ("on", "stopped"))
    assert on["train_state"]["lr_start"] == stopped["train_state"]["lr_start"] == 2
    assert all(torch.equal(on["model"][k], stopped["model"][k]) for k in on["model"])


def test_resuming_with_other_eval_bleu_search_settings_starts_the_best_bleu_again(toy_data_bin, tmp_path):
    """A best BLEU of beam 1 had been compared with BLEU of beam 3 (and --patience counted across), unlogged."""
    base = ["train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--validate-interval-updates", 1, "--eval-bleu"]
    base += ["--best-checkpoint-metric", "bleu", "--eval-bleu-max-len-b", 3]
    assert nmt(*base, "--max-update", 1, "--eval-bleu-beam", 1).exit_code == 0
    result = nmt(*base, "--max-update", 2, "--eval-bleu-beam", 3, "--log-file", tmp_path / "log.jsonl")
    assert result.exit_code == 0, result.output
    assert "--eval-bleu search settings differ from the checkpoint's: beam 3 (was 1)" in result.output
    assert "the best BLEU so far" in result.output and "starts again" in result.output
    valid = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines() if '"valid"' in line]
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]["best"] == valid[-1]["valid_bleu"]


def test_average_rejects_different_models(tiny_checkpoint, toy_data_bin, tmp_path):
    other = tmp_path / "other"
    assert nmt("train", toy_data_bin, "--save-dir", other, *TINY, "--d-model", 8, "--max-update", 1).exit_code == 0
    result = nmt(
        "average-checkpoints", "--inputs", tiny_checkpoint, other / "checkpoint_last.pt", "--output", tmp_path / "a.pt"
    )
    assert result.exit_code == 1 and "hold models of other shapes (d_model=" in result.output


def test_bad_inputs(toy_data_bin, tiny_checkpoint, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = nmt("train", empty, "--save-dir", tmp_path / "ck", *TINY, "--max-update", 1)
    assert r.exit_code == 1 and "is not an nmt data directory" in r.output
    r = nmt("train", tmp_path / "missing", "--save-dir", tmp_path / "ck", "--max-update", 1)
    assert r.exit_code == 1 and r.output.strip() == f"error: DATA_DIR {tmp_path / 'missing'} does not exist"
    r = nmt("train", tiny_checkpoint, "--save-dir", tmp_path / "ck", "--max-update", 1)
    assert (
        r.exit_code == 1
        and r.output.strip() == f"error: DATA_DIR {tiny_checkpoint} is not a directory; give a directory"
    )
    r = nmt("train", toy_data_bin, "--save-dir", tmp_path / "ck", "--arch", "transformer_huge", "--max-update", 1)
    assert r.exit_code == 2 and "--arch" in r.output
    r = nmt("train", toy_data_bin, "--save-dir", tmp_path / "ck", *TINY)
    assert r.exit_code == 1 and "stopping rule" in r.output
    r = nmt("train", toy_data_bin, "--save-dir", tmp_path / "ck", *TINY, "--max-update", 1, "--adam-betas", "0.9;x")
    assert r.exit_code == 1 and "--adam-betas" in r.output
    r = nmt("train", toy_data_bin, "--save-dir", tiny_checkpoint.parent, *TINY, "--d-model", 64, "--max-update", 99)
    assert r.exit_code == 1 and "another shape" in r.output and "d_model=32" in r.output
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "checkpoint_last.pt").write_bytes(b"not a checkpoint")
    r = nmt("train", toy_data_bin, "--save-dir", corrupt, *TINY, "--max-update", 1)
    assert r.exit_code == 1 and "not a readable nmt checkpoint" in r.output
    for res in (r,):
        assert "Traceback" not in res.output


def test_eval_bleu_picks_the_best_checkpoint_by_bleu(toy_data_bin, tmp_path):
    result = nmt(
        "train",
        toy_data_bin,
        "--save-dir",
        tmp_path,
        *TINY,
        "--max-update",
        2,
        "--validate-interval-updates",
        1,
        "--eval-bleu",
        "--eval-bleu-beam",
        2,
        "--best-checkpoint-metric",
        "bleu",
        "--log-file",
        tmp_path / "log",
    )
    assert result.exit_code == 0, result.output
    valid = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines() if '"valid"' in line]
    assert valid and all(0.0 <= r["valid_bleu"] <= 100.0 for r in valid)
    best = load_checkpoint(tmp_path / "checkpoint_best.pt")
    assert best["train_state"]["best"] == max(r["valid_bleu"] for r in valid)
    assert best["search_config"]["beam"] == 2  # generate's defaults come from here
