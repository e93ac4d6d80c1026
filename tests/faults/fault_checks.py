"""The fault suite's shared checks and fixtures: bad inputs and faults a user runs into, each asserted to end in
exactly one `error:` line (exit != 0, no traceback), with nothing half-written left behind and every earlier
checkpoint byte-identical. The suite is split by command, tests/faults/test_faults_<command>.py.

Cheap cases run in-process through click (an exception other than NmtError would surface there as
`result.exception`, the in-process form of a traceback); cases about stdin, signals and locks run `nmt`
as a subprocess. A test module takes the fixtures `work` and `other_data_bin` with
`pytest_plugins = ["fault_checks"]`.
"""

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import nmt, write_copy_corpus

from nmt_cli.config import PreprocessConfig
from nmt_cli.data.preprocess import preprocess

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LEFTOVER = re.compile(r"(\.tmp$|\.tmp-|\.lock$|\.raw$)")


# ---- checks shared by every case ------------------------------------------------------------------------
def error_lines(text):
    return [line for line in ANSI.sub("", text).splitlines() if line.lower().startswith("error:")]


def snapshot(root, pattern="*"):
    """sha256 of every file under root (to prove earlier files are byte-identical afterwards)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob(pattern))
        if p.is_file()
    }


def leftovers(root):
    return [str(p) for p in root.rglob("*") if LEFTOVER.search(p.name)]


def assert_clean_failure(rc, output, expected, root, before=None, exception=None):
    text = ANSI.sub("", output)
    assert rc != 0, text
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    assert "Traceback" not in text, text
    errors = error_lines(text)
    assert len(errors) == 1, text
    assert expected in errors[0], errors[0]
    assert not leftovers(root), leftovers(root)
    if before is not None:
        after = snapshot(root)
        assert {k: after.get(k) for k in before} == before, "an earlier file was changed or removed"


def preprocess_args(trainpref, destdir):
    """`preprocess` of a copy-task corpus (src -> tgt, 24 pieces) into destdir, as command-line words."""
    languages = ["--source-lang", "src", "--target-lang", "tgt"]
    return ["preprocess", *languages, "--trainpref", str(trainpref), "--destdir", str(destdir), "--vocab-size", "24"]


def nmt_subprocess(*args, stdin=subprocess.DEVNULL, input=None, shell_suffix=""):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "nmt_cli", "--no-progress", *[str(a) for a in args]]
    if shell_suffix:
        cmd = ["bash", "-c", " ".join(f"'{c}'" for c in cmd) + shell_suffix]
    return subprocess.run(
        cmd, input=input, stdin=None if input is not None else stdin, capture_output=True, env=env, timeout=120
    )


# ---- fixtures ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def other_data_bin(tmp_path_factory):
    """A data directory of the same vocabulary size but another sentencepiece model (other text)."""
    root = tmp_path_factory.mktemp("other")
    write_copy_corpus(root / "train", 500, seed=7)
    for name in ("train.src", "train.tgt"):  # letters instead of digits: another model, same size
        path = root / name
        path.write_text(path.read_text().translate(str.maketrans("0123456789", "abcdefghij")))
    shutil.copy(root / "train.src", root / "test.src")
    shutil.copy(root / "train.tgt", root / "test.tgt")
    dest = root / "bin"
    preprocess(
        PreprocessConfig(
            source_lang="src",
            target_lang="tgt",
            trainpref=str(root / "train"),
            testpref=str(root / "test"),
            destdir=str(dest),
            vocab_size=24,
            max_len_ratio=1.5,
        )
    )
    return dest


@pytest.fixture
def work(tmp_path, toy_data_bin, tiny_checkpoint):
    """A private copy of the data directory and of the tiny run's save directory."""
    shutil.copytree(toy_data_bin, tmp_path / "data")
    shutil.copytree(tiny_checkpoint.parent, tmp_path / "run")
    return tmp_path


# ---- damaged inputs, shared by the commands' tables ----------------------------------------------------------
def edit_meta(data_dir, **changes):
    meta = json.loads((data_dir / "meta.json").read_text())
    for key, value in changes.items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    (data_dir / "meta.json").write_text(json.dumps(meta))


def merge_two_sentences(data_dir):
    """What a corrupted offsets file does: sentences 3 and 4 become one (and 4 empty), still monotone."""
    path = data_dir / "train.src.idx.npy"
    offsets = np.load(path)
    offsets[4] = offsets[3]
    np.save(path, offsets)


def id_beyond_the_vocabulary(data_dir, split):
    """A token id past the vocabulary in the token file (not checksummed): an IndexError in the embedding."""
    path = data_dir / f"{split}.tgt.bin.npy"
    tokens = np.load(path)
    tokens[7] = 60000
    np.save(path, tokens)


def reversed_data(work):
    """work/reversed: the same data directory read tgt -> src (the same files, the languages swapped)."""
    shutil.copytree(work / "data", work / "reversed")
    edit_meta(work / "reversed", source_lang="tgt", target_lang="src")


# ---- the in-process cases: each command's table runs through this check -------------------------------------
def check_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus):
    """One case of a test_fault_in_process table: its setup, then `nmt ARGS` fails cleanly with `expected` and
    leaves every earlier file of the work directory as it was."""
    shutil.copytree(other_data_bin, work / "other")
    if "avg0" in case_id or case_id == "resume-from-an-averaged-checkpoint":
        assert (
            nmt(
                "average-checkpoints",
                "--inputs",
                work / "run" / "checkpoint_4.pt",
                work / "run" / "checkpoint_6.pt",
                "--output",
                work / "avg0.pt",
            ).exit_code
            == 0
        )
    if setup is not None:
        setup(work)
    before = snapshot(work)
    argv = args.format(w=work, other=work / "other", corpus=toy_corpus).split()
    r = nmt(*argv, input="1 2\n")
    assert_clean_failure(r.exit_code, r.output, expected, work, before, r.exception)
    assert r.stdout == "" or r.exit_code == 2, r.stdout  # nothing of the failed buffer was written


# ---- a full disk --------------------------------------------------------------------------------------------
def full_disk_after(n_bytes):
    """A torch.save that writes some bytes, then fails as a full disk does (several chained errors)."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if hasattr(f, "write"):
            f.write(b"x" * n_bytes)
            try:
                raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos")
            except RuntimeError:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    return save


# ---- signals while a big file is written ------------------------------------------------------------------
# `nmt` run by a driver that sends the process a signal at a chosen moment of a write: `hook` is Python that
# patches the writer (with os, signal, sys, torch, time and SIG imported), then the CLI runs as `nmt` does.
DRIVER = """
import os, signal, sys, time
import torch
SIG = getattr(signal, sys.argv.pop(1))
{hook}
from nmt_cli.cli import main
sys.argv[0] = "nmt"
main()
"""


def driven(hook, signal_name, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = DRIVER.format(hook=hook)
    cmd = [sys.executable, "-c", code, signal_name, "--no-progress", *map(str, args)]
    return subprocess.run(
        cmd, capture_output=True, env=env, timeout=120, stdin=subprocess.DEVNULL, preexec_fn=sigint_default
    )


def sigint_default():
    """In the child: SIGINT handled as at a terminal. A shell's background job (`make test &`) starts with
    SIGINT ignored, Python keeps it so (as nohup means it to), and the SIGINT tests then saw it finish."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
