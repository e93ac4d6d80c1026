"""The fault suite for `nmt preprocess`: bad prefixes and destinations, a full disk, a destdir in use, a signal."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import write_copy_corpus

pytest.register_assert_rewrite("fault_checks")  # before the import, so that its asserts show their values
from fault_checks import (
    ROOT,
    assert_clean_failure,
    check_fault_in_process,
    nmt,
    preprocess_args,
)

from nmt_cli.files import run_lock

pytest_plugins = ["fault_checks"]  # its fixtures: work, other_data_bin


# (id, setup(work) or None, args (strings with {w} for the work dir, {other} for other_data_bin), expected)
CASES = [
    (
        "preprocess-testpref-with-an-empty-prefix",
        None,
        "preprocess --source-lang src --target-lang tgt --trainpref {corpus}/train --testpref {corpus}/test,,"
        "{corpus}/valid --destdir {w}/dest --vocab-size 24",
        "has an empty prefix; separate the prefixes with single commas",
    ),
    (
        "preprocess-destdir-is-an-empty-file",
        lambda w: (w / "dest").write_text(""),
        "preprocess --source-lang src --target-lang tgt --trainpref {corpus}/train --destdir {w}/dest --vocab-size 24",
        "is a file, not a directory",
    ),
    (
        "preprocess-destdir-not-empty",
        None,
        "preprocess --source-lang src --target-lang tgt --trainpref {corpus}/train --destdir {w}/run --vocab-size 24",
        "is not empty",
    ),
    (
        "preprocess-input-is-a-directory",
        lambda w: [(w / "c" / f"train.{lang}").mkdir(parents=True) for lang in ("src", "tgt")],
        "preprocess --source-lang src --target-lang tgt --trainpref {w}/c/train --destdir {w}/dest --vocab-size 24",
        "is a directory",
    ),
]


@pytest.mark.parametrize("case_id,setup,args,expected", CASES, ids=[c[0] for c in CASES])
def test_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus):
    check_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus)


def test_full_disk_while_preprocessing(work, toy_corpus, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    r = nmt(*preprocess_args(toy_corpus / "train", work / "dest"))
    assert_clean_failure(
        r.exit_code, r.output, "no space left on device writing --destdir", work, exception=r.exception
    )
    assert not (work / "dest").exists()


def test_full_disk_while_sentencepiece_trains(work, toy_corpus, monkeypatch):
    """The disk fills during training: sentencepiece's own writer ignores that and leaves an empty model
    (truncated here as it does); every later write of data fails as on a full disk."""
    import sentencepiece as spm

    real_train, real_write_bytes, full = spm.SentencePieceTrainer.train, Path.write_bytes, []

    def train(**kwargs):
        real_train(**kwargs)
        if kwargs.get("model_prefix"):  # sentencepiece wrote the model file itself
            os.truncate(f"{kwargs['model_prefix']}.model", 0)
        full.append(True)

    def write_bytes(self, data):
        if full and data:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_bytes(self, data)

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", train)
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    r = nmt(*preprocess_args(toy_corpus / "train", work / "dest"))
    assert_clean_failure(
        r.exit_code, r.output, f"no space left on device writing --destdir {work / 'dest'}", work, exception=r.exception
    )
    assert not (work / "dest").exists()


def test_preprocess_refuses_a_destdir_in_use(toy_corpus, tmp_path):
    dest = tmp_path / "dest"
    # the command runs in this process: an flock taken on another open of the file conflicts as another process's
    # does (test_recoveries.py's test_lock_is_exclusive_and_released takes one from another process)
    with run_lock(tmp_path / ".dest.lock", "preprocess", dest):  # what a running preprocess holds
        r = nmt(*preprocess_args(toy_corpus / "train", dest))
        assert_clean_failure(
            r.exit_code,
            r.output,
            f"another nmt preprocess is using {dest} (pid {os.getpid()})",
            tmp_path / "none",
            exception=r.exception,
        )
    assert not dest.exists()


def test_preprocess_removes_what_a_killed_run_left(toy_corpus, tmp_path):
    stale = tmp_path / ".dest.tmp-abc123"  # what SIGKILL leaves: the unrenamed temporary directory
    stale.mkdir()
    (stale / "train.src.raw").write_bytes(b"\0" * 100)
    (tmp_path / ".dest.lock").write_text("12345\n")  # and its lock file, which no longer locks anything
    r = nmt(*preprocess_args(toy_corpus / "train", tmp_path / "dest"))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]


def test_preprocess_sigterm_leaves_nothing(tmp_path):
    write_copy_corpus(tmp_path / "big" / "train", 200_000, seed=5)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nmt_cli",
            "--no-progress",
            *preprocess_args(tmp_path / "big" / "train", tmp_path / "dest"),
            "--workers",
            "1",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".dest.tmp-*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=60)[1].decode()
    assert_clean_failure(proc.returncode, stderr, "stopped by SIGTERM", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]


def test_a_signal_just_after_the_temporary_directory_is_made_leaves_nothing(tmp_path, monkeypatch):
    """The race CI once hit (test_preprocess_sigterm_leaves_nothing: killed by the default SIGTERM, its temporary
    directory left, no error line): the stop handler is set before mkdtemp makes the directory, and a signal at
    once after it, before its name is returned, still stops the run cleanly with the directory gone."""
    import tempfile

    from nmt_cli.files import directory_in_place
    from nmt_cli.signals import Interrupted

    made = tempfile.mkdtemp

    def mkdtemp_then_signal(*args, **kwargs):
        made_dir = made(*args, **kwargs)
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), "SIGTERM is not handled yet when the temporary directory exists"
        handler(signal.SIGTERM, None)  # as the signal arriving here would
        return made_dir

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_signal)
    stopped = pytest.raises(Interrupted, match="stopped by SIGTERM")
    with stopped, directory_in_place(tmp_path / "dest", "--destdir", "preprocess"):
        raise AssertionError("the block is never entered")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
