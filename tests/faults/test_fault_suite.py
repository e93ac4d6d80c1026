"""The fault suite: bad inputs and faults a user runs into, each asserted to end in exactly one `error:` line
(exit != 0, no traceback), with nothing half-written left behind and every earlier checkpoint byte-identical.

Cheap cases run in-process through click (an exception other than NmtError would surface there as
`result.exception`, the in-process form of a traceback); cases about stdin, signals and locks run `nmt`
as a subprocess.
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
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import TINY, write_copy_corpus

from nmt_cli.cli import cli
from nmt_cli.config import PreprocessConfig
from nmt_cli.data.preprocess import preprocess
from nmt_cli.files import run_lock

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


def nmt(*args, input=None):
    return CliRunner().invoke(cli, ["--no-progress", *[str(a) for a in args]], input=input)


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


def edit_meta(data_dir, **changes):
    meta = json.loads((data_dir / "meta.json").read_text())
    for key, value in changes.items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    (data_dir / "meta.json").write_text(json.dumps(meta))


def truncate_bin(data_dir):
    path = data_dir / "train.src.bin.npy"
    path.write_bytes(path.read_bytes()[:-10])


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


def break_offsets_without_checksums(data_dir):
    merge_two_sentences(data_dir)
    path = data_dir / "train.src.idx.npy"
    offsets = np.load(path)
    offsets[-1] += 5
    np.save(path, offsets)
    edit_meta(data_dir, checksums=None)


def reversed_data(work):
    """work/reversed: the same data directory read tgt -> src (the same files, the languages swapped)."""
    shutil.copytree(work / "data", work / "reversed")
    edit_meta(work / "reversed", source_lang="tgt", target_lang="src")


def train_on(name, make_data=None):
    """A setup that trains 2 updates on work/<name> (made by make_data first) into work/run-<name>."""

    def setup(work):
        if make_data is not None:
            make_data(work)
        assert nmt("train", work / name, "--save-dir", work / f"run-{name}", *TINY, "--max-update", 2).exit_code == 0

    return setup


def newer_checkpoint(work):
    state = torch.load(work / "run" / "checkpoint_last.pt", weights_only=True)
    state["format_version"] = 99
    torch.save(state, work / "new.pt")


NEW_RUN = "train {w}/data --save-dir {w}/new " + " ".join(TINY) + " --max-update 2"  # a fresh tiny run

# (id, setup(work) or None, args (strings with {w} for the work dir, {other} for other_data_bin), expected)
IN_PROCESS = [
    (
        "generate-data-of-another-vocabulary",
        None,
        "generate {other} --path {w}/run/checkpoint_last.pt --gen-subset test",
        "is not the sentencepiece model of",
    ),
    (
        "resume-on-data-of-another-vocabulary",
        None,
        "train {other} --save-dir {w}/run " + " ".join(TINY) + " --max-update 9",
        "is not the sentencepiece model of",
    ),
    (
        "generate-data-of-the-other-direction",
        reversed_data,
        "generate {w}/reversed --path {w}/run/checkpoint_last.pt --gen-subset test",
        "was trained src->tgt but",
    ),
    (
        "resume-on-data-of-the-other-direction",
        reversed_data,
        "train {w}/reversed --save-dir {w}/run " + " ".join(TINY) + " --max-update 9",
        "holds tgt->src; resume on its data directory",
    ),
    (
        "average-checkpoints-of-another-vocabulary",
        train_on("other"),
        "average-checkpoints --inputs {w}/run/checkpoint_last.pt {w}/run-other/checkpoint_last.pt --output {w}/a.pt",
        "has another sentencepiece model than",
    ),
    (
        "average-checkpoints-of-the-other-direction",
        train_on("reversed", reversed_data),
        "average-checkpoints --inputs {w}/run/checkpoint_last.pt {w}/run-reversed/checkpoint_last.pt --output {w}/a.pt",
        "was trained for tgt->src",
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
        "average-input-not-a-checkpoint",
        lambda w: (w / "junk.pt").write_bytes(b"junk"),
        "average-checkpoints --inputs {w}/junk.pt {w}/run/checkpoint_6.pt --output {w}/avg.pt",
        "not a readable nmt checkpoint",
    ),
    (
        "resume-from-an-averaged-checkpoint",
        lambda w: shutil.copy(w / "avg0.pt", w / "run" / "checkpoint_last.pt"),
        "train {w}/data --save-dir {w}/run " + " ".join(TINY) + " --max-update 9",
        "has no training state",
    ),
    (
        "checkpoint-from-a-newer-nmt",
        newer_checkpoint,
        "generate --path {w}/new.pt --input {w}/run/config.json",
        "has format version 99",
    ),
    ("generate-path-is-a-directory", None, "generate --path {w}/run --input {w}/run/config.json", "is a directory"),
    (
        "generate-input-is-a-directory",
        None,
        "generate --path {w}/run/checkpoint_last.pt --input {w}/run",
        "is a directory",
    ),
    (
        "generate-input-invalid-utf8",
        lambda w: (w / "bad.txt").write_bytes(b"1 2\n3 4\n5 \xff 6\n7\n"),
        "generate --path {w}/run/checkpoint_last.pt --input {w}/bad.txt",
        "bad.txt:3: invalid UTF-8",
    ),
    (
        "generate-input-already-in-pieces",  # fairseq-interactive's BPE'd input, encoded again, had been garbage
        lambda w: (w / "pieces.txt").write_text("1 2\n\u25813 \u25814\n"),
        "generate --path {w}/run/checkpoint_last.pt --input {w}/pieces.txt",
        "pieces.txt:2: the line holds sentencepiece pieces",
    ),
    (
        "generate-results-path-is-a-file",
        lambda w: (w / "file").write_text("x"),
        "generate {w}/data --path {w}/run/checkpoint_last.pt --gen-subset test --results-path {w}/file",
        "is a file",
    ),
    (
        "generate-negative-max-len-b",
        None,
        "generate --path {w}/run/checkpoint_last.pt --input - --max-len-b -1",
        "--max-len-b",
    ),
    ("generate-nan-lenpen", None, "generate --path {w}/run/checkpoint_last.pt --input - --lenpen nan", "--lenpen"),
    ("generate-inf-lenpen", None, "generate --path {w}/run/checkpoint_last.pt --input - --lenpen inf", "--lenpen"),
    ("generate-zero-beam", None, "generate --path {w}/run/checkpoint_last.pt --input - --beam 0", "--beam"),
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
        "generate-gen-subset-with-input",
        lambda w: (w / "in.txt").write_text("1 2 3\n"),
        "generate --path {w}/run/checkpoint_last.pt --input {w}/in.txt --gen-subset valid",
        "--gen-subset picks a split of DATA_DIR",
    ),
    (
        "generate-buffer-size-with-data-dir",
        None,
        "generate {w}/data --path {w}/run/checkpoint_last.pt --buffer-size 5",
        "--buffer-size is for --input",
    ),
    (
        "generate-temperature-without-sampling",
        None,
        "generate {w}/data --path {w}/run/checkpoint_last.pt --temperature 0.5",
        "--sampling is off, so --temperature would be ignored",
    ),
    (
        "generate-int8-with-fp16",  # had said "on CPU use --precision bf16", which int8 refuses too
        None,
        "generate {w}/data --path {w}/run/checkpoint_last.pt --quantize int8 --precision fp16",
        "--quantize int8 runs on the CPU in fp32; drop --precision fp16",
    ),
    (
        "generate-seed-without-sampling",  # accepted and ignored: beam search draws nothing
        None,
        "generate {w}/data --path {w}/run/checkpoint_last.pt --seed 3",
        "--sampling is off, so --seed would be ignored",
    ),
    (
        "generate-beam-with-sampling",  # sampled one hypothesis per sentence, the beam ignored
        None,
        "generate {w}/data --path {w}/run/checkpoint_last.pt --sampling --beam 5",
        "so --beam 5 would be ignored; for 5 samples of each sentence give --nbest 5",
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
        "generate-token-id-beyond-the-vocabulary",
        lambda w: id_beyond_the_vocabulary(w / "data", "valid"),
        "generate {w}/data --path {w}/run/checkpoint_last.pt --gen-subset valid",
        "valid.tgt.bin.npy: sentence 2 holds token id 60000",
    ),
    (
        "corrupted-idx-merges-sentences",
        lambda w: merge_two_sentences(w / "data"),
        NEW_RUN,
        "does not match the checksum",
    ),
    (
        "corrupted-idx-without-checksums",
        lambda w: break_offsets_without_checksums(w / "data"),
        "generate {w}/data --path {w}/run/checkpoint_last.pt --gen-subset train",
        "records no checksums of its offsets files",  # had read on, and noticed only the last offset
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
    (
        "meta-not-ours",
        lambda w: (w / "data" / "meta.json").write_text("[1, 2]"),
        "generate {w}/data --path {w}/run/checkpoint_last.pt --gen-subset test",
        "is not an nmt data description",
    ),
    (
        "spm-model-replaced",
        lambda w: shutil.copy(w / "other" / "spm.model", w / "data" / "spm.model"),
        "generate {w}/data --path {w}/run/checkpoint_last.pt --gen-subset test",
        "is not the model",
    ),
    (
        "score-empty-sys-and-ref",
        lambda w: [(w / n).write_text("") for n in ("hyp", "ref")],
        "score --sys {w}/hyp --ref {w}/ref",
        "is empty",
    ),
    (
        "score-sys-is-a-directory",
        lambda w: (w / "ref").write_text("a\n"),
        "score --sys {w}/run --ref {w}/ref",
        "is a directory",
    ),
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


@pytest.mark.parametrize("case_id,setup,args,expected", IN_PROCESS, ids=[c[0] for c in IN_PROCESS])
def test_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus):
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


def test_full_disk_while_training_saves(work, monkeypatch):
    before = snapshot(work / "run", "*.pt")  # config.json is rewritten at every start, by design
    monkeypatch.setattr(torch, "save", full_disk_after(100))
    r = nmt("train", work / "data", "--save-dir", work / "run", *TINY, "--max-update", 7)
    assert_clean_failure(r.exit_code, r.output, "no space left on device writing", work / "run", before, r.exception)
    assert "the previous checkpoint is intact" in r.output


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


def test_full_disk_while_preprocessing(work, toy_corpus, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    r = nmt(*preprocess_args(toy_corpus / "train", work / "dest"))
    assert_clean_failure(
        r.exit_code, r.output, "no space left on device writing --destdir", work, exception=r.exception
    )
    assert not (work / "dest").exists()


# ---- stdin, locks and signals: real processes ---------------------------------------------------------------
def test_invalid_utf8_on_stdin(tiny_checkpoint, tmp_path):
    r = nmt_subprocess(
        "generate",
        "--path",
        tiny_checkpoint,
        "--input",
        "-",
        "--buffer-size",
        2,
        input=b"1 2\n3 4\n5 6\n7 \xc3\x28 8\n9\n",
    )
    assert_clean_failure(r.returncode, r.stderr.decode(), "stdin:4: invalid UTF-8", tmp_path)
    assert len(r.stdout.decode().splitlines()) == 2, "the first buffer is translated, nothing of the bad one"


def test_closed_stdin(tiny_checkpoint, tmp_path):
    r = nmt_subprocess("generate", "--path", tiny_checkpoint, "--input", "-", shell_suffix=" <&-")
    assert_clean_failure(r.returncode, r.stderr.decode(), "stdin is closed", tmp_path)


def test_preprocess_refuses_a_destdir_in_use(toy_corpus, tmp_path):
    dest = tmp_path / "dest"
    with run_lock(tmp_path / ".dest.lock", "preprocess", dest):  # what a running preprocess holds
        r = nmt_subprocess(*preprocess_args(toy_corpus / "train", dest))
        assert_clean_failure(
            r.returncode,
            r.stderr.decode(),
            f"another nmt preprocess is using {dest} (pid {os.getpid()})",
            tmp_path / "none",
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
    save, n_kills = tmp_path / "run", 0
    while n_kills < 6:
        proc = train_process(toy_data_bin, save, *extra)
        saves, wanted = threading.Event(), rng.randint(1, 4)
        count = [0]

        def drain():
            for line in proc.stderr:
                if "saved checkpoint_last.pt" in line:
                    count[0] += 1
                    if count[0] >= wanted:
                        saves.set()

        threading.Thread(target=drain, daemon=True).start()
        saves.wait(timeout=120)
        time.sleep(rng.uniform(0.0, 0.4))  # anywhere: mid-update, mid-save, between the files of one save
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


# ---- standard output: one way for every command -------------------------------------------------------------
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


# ---- signals while a big file is written, and what a killed run left ----------------------------------------
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

# torch.save into a file whose first write signals the process: the signal arrives inside torch's zip writer
SIGNAL_IN_TORCH_SAVE = """
real_save = torch.save
class Signalling:
    def __init__(self, f): self.f = f
    def write(self, data):
        n = self.f.write(data)
        os.kill(os.getpid(), SIG)
        time.sleep(0.2)
        return n
    def flush(self): self.f.flush()
torch.save = lambda obj, f, *a, **k: real_save(obj, Signalling(f), *a, **k)
"""

# the converter writes part of the export, then the process is signalled
SIGNAL_IN_EXPORT = """
import nmt_cli.export.to_ctranslate2 as ct2
def convert(path, out, quantization):
    (out / "model.bin").write_bytes(b"half a model")
    os.kill(os.getpid(), SIG)
    time.sleep(5)
ct2.convert = convert
"""

# translating the first buffer signals the process (the results file is open, half written)
SIGNAL_IN_GENERATE = """
import nmt_cli.commands.generate as command
real_translate = command.translate
def translate(*args, **kwargs):
    os.kill(os.getpid(), SIG)
    time.sleep(5)
command.translate = translate
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


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_while_exporting_stops_cleanly(signal_name, tiny_checkpoint, tmp_path):
    r = driven(SIGNAL_IN_EXPORT, signal_name, "export", "--path", tiny_checkpoint, "--output", tmp_path / "ct2")
    assert_clean_failure(r.returncode, r.stderr.decode(), f"stopped by {signal_name}", tmp_path)
    assert list(tmp_path.iterdir()) == [], "the export's temporary directory or lock was left"


def test_a_signal_while_generating_into_results_path_stops_cleanly(work):
    results = work / "results"
    r = driven(
        SIGNAL_IN_GENERATE,
        "SIGTERM",
        *("generate", work / "data", "--path", work / "run" / "checkpoint_last.pt", "--results-path", results),
    )
    assert_clean_failure(r.returncode, r.stderr.decode(), "stopped by SIGTERM", work)
    assert list(results.iterdir()) == []


def test_export_removes_what_a_killed_export_left(tiny_checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    assert nmt("export", "--path", tiny_checkpoint, "--output", out).exit_code == 0
    stale = tmp_path / ".ct2.tmp-abc123"  # what SIGKILL leaves: the unrenamed temporary directory
    stale.mkdir()
    (stale / "model.bin").write_bytes(b"\0" * 100)
    r = nmt("export", "--path", tiny_checkpoint, "--output", out, "--force")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]
    assert "left by an interrupted run" in r.output


# ---- average-checkpoints never replaces a training state unasked --------------------------------------------
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


# ---- plot attention on a parser draws the tree the parser would write -----------------------------------------
@pytest.fixture(scope="module")
def tiny_parser(tmp_path_factory):
    tree = "((S (NP-SBJ (DT The) (NN cat)) (VP (VBZ sits) (PP-LOC (IN on) (NP (DT the) (NN mat)))) (. .)))"
    root = tmp_path_factory.mktemp("parser")
    (root / "train.tree").write_text((tree + "\n") * 20)
    (root / "train.words").write_text("The cat sits on the mat .\n" * 20)
    tree_args = ["-s", "words", "-t", "tree", "--target-format", "ptb-tree", "--vocab-size", "40"]
    assert nmt("preprocess", *tree_args, "--trainpref", root / "train", "--destdir", root / "bin").exit_code == 0
    r = nmt("train", root / "bin", "--save-dir", root / "ck", *TINY, "--max-update", 2)
    assert r.exit_code == 0, r.output
    return root / "ck" / "checkpoint_last.pt"


def test_plot_attention_on_a_parser_draws_a_tree_of_the_words(tiny_parser):
    from nmt_cli.parsing.linearize import delinearize, piece_token
    from nmt_cli.plot.attention import sentence_attention

    words = ["A", "dog", "sits", "on", "the", "mat", "."]
    att = sentence_attention(tiny_parser, " ".join(words))
    tree_pieces = [piece_token(p) for p in att.tgt_out_pieces[:-1]]  # without </s>; <(NP> spelt as (NP
    assert len(tree_pieces) <= 4 * len(words) + 4, len(tree_pieces)  # had run on to the input length + 300
    delinearize(tree_pieces, words)  # a tree of exactly these words, as generate would parse


# ---- score reads lines as generate does ----------------------------------------------------------------------
def test_score_drops_a_byte_order_mark(tmp_path):
    text = "the cat sat on the mat\nand then it left\n"
    (tmp_path / "bom").write_bytes("\ufeff".encode() + text.encode())
    (tmp_path / "plain").write_text(text)
    for sys_file, ref_file in (("bom", "bom"), ("bom", "plain"), ("plain", "bom")):
        r = nmt("score", "--sys", tmp_path / sys_file, "--ref", tmp_path / ref_file, "--metric", "sacrebleu", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["score"] == 100.0, (sys_file, ref_file, r.stdout)


def test_score_ends_lines_at_newlines_only_as_generate_does(tmp_path):
    from nmt_cli.commands.generate import read_lines

    (tmp_path / "hyp").write_bytes(b"a b c\nd \r e f\ng h\n")  # a lone carriage return inside line 2
    (tmp_path / "ref").write_text("a b c\nd e f\ng h\n")
    with (tmp_path / "hyp").open("rb") as f:
        assert len([line for chunk in read_lines(f, 100, "hyp") for line in chunk]) == 3
    r = nmt("score", "--sys", tmp_path / "hyp", "--ref", tmp_path / "ref", "--metric", "sacrebleu")
    assert r.exit_code == 0, r.output


# ---- a disk that fills while sentencepiece trains -------------------------------------------------------------
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
