"""The fault suite for `nmt train`: bad options and data, resume on the wrong data, a full disk, two trains on one
save directory, and SIGKILL at random points."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import TINY

pytest.register_assert_rewrite("fault_checks")  # before the import, so that its asserts show their values
from fault_checks import (
    ANSI,
    ROOT,
    assert_clean_failure,
    check_fault_in_process,
    edit_meta,
    error_lines,
    full_disk_after,
    id_beyond_the_vocabulary,
    leftovers,
    merge_two_sentences,
    nmt,
    nmt_subprocess,
    reversed_data,
    snapshot,
)

pytest_plugins = ["fault_checks"]  # its fixtures: work, other_data_bin


def truncate_bin(data_dir):
    path = data_dir / "train.src.bin.npy"
    path.write_bytes(path.read_bytes()[:-10])


NEW_RUN = "train {w}/data --save-dir {w}/new " + " ".join(TINY) + " --max-update 2"  # a fresh tiny run

# (id, setup(work) or None, args (strings with {w} for the work dir, {other} for other_data_bin), expected)
CASES = [
    (
        "resume-on-data-of-another-vocabulary",
        None,
        "train {other} --save-dir {w}/run " + " ".join(TINY) + " --max-update 9",
        "is not the sentencepiece model of",
    ),
    (
        "resume-on-data-of-the-other-direction",
        reversed_data,
        "train {w}/reversed --save-dir {w}/run " + " ".join(TINY) + " --max-update 9",
        "holds tgt->src; resume on its data directory",
    ),
    (
        "resume-from-an-averaged-checkpoint",
        lambda w: shutil.copy(w / "avg0.pt", w / "run" / "checkpoint_last.pt"),
        "train {w}/data --save-dir {w}/run " + " ".join(TINY) + " --max-update 9",
        "has no training state",
    ),
    (
        "train-negative-max-tokens",
        None,
        NEW_RUN + " --max-tokens -5",
        "--max-tokens",
    ),
    (
        "train-lr-scale-with-inverse-sqrt",
        None,
        NEW_RUN + " --lr-scheduler inverse_sqrt --lr-scale 2",
        "--lr-scale multiplies noam's lr",
    ),
    (
        "train-min-loss-scale-without-fp16",  # accepted and ignored: only fp16 scales the loss
        None,
        NEW_RUN + " --min-loss-scale 0.1",
        "--min-loss-scale bounds fp16's loss scaling; this run trains in fp32",
    ),
    (
        "train-eval-bleu-max-tokens-without-eval-bleu",
        None,
        NEW_RUN + " --eval-bleu-max-tokens 100",
        "--eval-bleu-max-tokens needs --eval-bleu",
    ),
    (
        "train-log-file-is-a-checkpoint",  # appended JSON lines to it before
        None,
        NEW_RUN + " --log-file {w}/run/checkpoint_last.pt",
        "exists and is not a log of nmt train",
    ),
    (
        "train-nan-lr",
        None,
        NEW_RUN + " --lr-scale nan",
        "--lr-scale",
    ),
    (
        "train-max-positions-below-every-pair",
        None,
        NEW_RUN + " --max-positions 2",
        "is longer than --max-positions 2 allows",
    ),
    (
        "train-max-tokens-below-every-pair",
        None,
        NEW_RUN + " --max-tokens 2",
        "is longer than --max-tokens 2 allows",
    ),
    (
        "train-patience-without-a-valid-split",
        None,
        "train {other} --save-dir {w}/new " + " ".join(TINY) + " --max-update 2 --patience 2 --eval-bleu",
        "--patience and --eval-bleu need a valid split",
    ),
    (
        "truncated-bin",
        lambda w: truncate_bin(w / "data"),
        NEW_RUN,
        "train.src.bin.npy is truncated",
    ),
    (
        "train-token-id-beyond-the-vocabulary",
        lambda w: id_beyond_the_vocabulary(w / "data", "train"),
        NEW_RUN,
        "train.tgt.bin.npy: sentence 2 holds token id 60000, beyond the vocabulary's",
    ),
    (
        "corrupted-idx-merges-sentences",
        lambda w: merge_two_sentences(w / "data"),
        NEW_RUN,
        "does not match the checksum",
    ),
    (
        "meta-without-checksums",  # a corrupted offsets file that stays monotone would go unnoticed
        lambda w: edit_meta(w / "data", checksums=None),
        NEW_RUN,
        're-run "nmt preprocess" to remake',
    ),
    (
        "meta-from-a-newer-nmt",
        lambda w: edit_meta(w / "data", format_version=7, nmt_version="9.0"),
        "train {w}/data --save-dir {w}/run " + " ".join(TINY) + " --max-update 9",
        "format version 7",
    ),
]


@pytest.mark.parametrize("case_id,setup,args,expected", CASES, ids=[c[0] for c in CASES])
def test_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus):
    check_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus)


def test_full_disk_while_training_saves(work, monkeypatch):
    before = snapshot(work / "run", "*.pt")  # config.json is rewritten at every start, by design
    monkeypatch.setattr(torch, "save", full_disk_after(100))
    r = nmt("train", work / "data", "--save-dir", work / "run", *TINY, "--max-update", 7)
    assert_clean_failure(r.exit_code, r.output, "no space left on device writing", work / "run", before, r.exception)
    assert "the previous checkpoint is intact" in r.output


def train_process(data, save, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nmt_cli",
            "--no-progress",
            "train",
            str(data),
            "--save-dir",
            str(save),
            *TINY,
            *map(str, extra),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )


@pytest.mark.slow  # three training processes, one SIGKILLed (12 s); make test-all
def test_two_trains_on_one_save_dir_then_a_killed_one(toy_data_bin, tmp_path):
    save = tmp_path / "run"
    first = train_process(toy_data_bin, save, "--max-update", 100000, "--save-interval-updates", 1)
    for line in first.stderr:
        if "saved checkpoint_last.pt at update 2" in line:
            break
    second = nmt_subprocess("train", toy_data_bin, "--save-dir", save, *TINY, "--max-update", 3)
    err = ANSI.sub("", second.stderr.decode())
    assert second.returncode == 1 and "Traceback" not in err
    assert error_lines(err) == [
        f"error: another nmt train is using {save} (pid {first.pid}); wait for it to finish or stop it"
    ]
    first.send_signal(signal.SIGKILL)  # its lock file stays behind, but the lock died with it
    first.wait(timeout=30)
    (save / "checkpoint_last.pt.tmp").write_bytes(b"half a checkpoint")  # as a kill during a save leaves
    update = torch.load(save / "checkpoint_last.pt", weights_only=True)["update"]
    # The numbered checkpoints checkpoint_last.pt has passed are final; one written after it (a kill between the
    # two writes of a save) is of an update the resumed run repeats and rewrites.
    numbered = {
        p.name: p.read_bytes()
        for p in save.glob("checkpoint_*.pt")
        if p.stem.split("_")[1].isdigit() and int(p.stem.split("_")[1]) <= update
    }
    third = nmt_subprocess(
        "train", toy_data_bin, "--save-dir", save, *TINY, "--max-update", update + 1, "--save-interval-updates", 1
    )
    assert third.returncode == 0, third.stderr.decode()
    assert "left by an interrupted run" in third.stderr.decode() and "checkpoint_last.pt.tmp" in third.stderr.decode()
    assert not leftovers(save)
    assert all((save / name).read_bytes() == data for name, data in numbered.items())
    assert torch.load(save / "checkpoint_last.pt", weights_only=True)["update"] == update + 1


# ---- torture: SIGKILL at random points, resume, compare with an uninterrupted run ---------------------------
@pytest.mark.slow
def test_torture_random_sigkills_resume_bit_identical(toy_data_bin, tmp_path):
    import random
    import threading

    rng = random.Random(1234)
    extra = ["--max-update", 24, "--save-interval-updates", 1, "--dropout", 0.1, "--max-tokens", 512]
    ref = train_process(toy_data_bin, tmp_path / "ref", *extra)
    assert ref.wait(timeout=300) == 0, ref.stderr.read()
    save, n_kills, interval = tmp_path / "run", 0, 0.2
    while n_kills < 6:
        proc = train_process(toy_data_bin, save, *extra)
        saves, wanted = threading.Event(), rng.randint(1, 4)
        saved_at = []  # when each save was logged

        def drain():
            for line in proc.stderr:
                if "saved checkpoint_last.pt" in line:
                    saved_at.append(time.monotonic())
                    if len(saved_at) >= wanted:
                        saves.set()

        threading.Thread(target=drain, daemon=True).start()
        saves.wait(timeout=120)
        times = list(saved_at)
        if len(times) >= 2:  # an update and its save take this machine this long (a fast CPU: a few ms)
            interval = times[-1] - times[-2]
        # anywhere within the next update or so: mid-update, mid-save, between the files of one save
        time.sleep(rng.uniform(0.0, 1.5 * interval))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        n_kills += 1
    final = train_process(toy_data_bin, save, *extra)
    assert final.wait(timeout=300) == 0, final.stderr.read()
    assert n_kills >= 3, "the run finished before it was killed often enough"
    assert not leftovers(save)
    a, b = (torch.load(d / "checkpoint_last.pt", weights_only=True) for d in (tmp_path / "ref", save))
    assert a["update"] == b["update"] == 24
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for va, vb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(va[k], vb[k]) for k in va)
    for u in range(1, 25):  # every numbered checkpoint of the killed run is there and equals the reference's
        ma = torch.load(tmp_path / "ref" / f"checkpoint_{u}.pt", weights_only=True)["model"]
        mb = torch.load(save / f"checkpoint_{u}.pt", weights_only=True)["model"]
        assert all(torch.equal(ma[k], mb[k]) for k in ma), u
