"""The fault suite for `nmt generate`: bad options, inputs and data, stdin that is invalid or closed, a signal."""

import shutil

import numpy as np
import pytest
import torch

pytest.register_assert_rewrite("fault_checks")  # before the import, so that its asserts show their values
from fault_checks import (
    assert_clean_failure,
    check_fault_in_process,
    driven,
    edit_meta,
    id_beyond_the_vocabulary,
    merge_two_sentences,
    nmt,
    nmt_subprocess,
    reversed_data,
)

pytest_plugins = ["fault_checks"]  # its fixtures: work, other_data_bin


def newer_checkpoint(work):
    state = torch.load(work / "run" / "checkpoint_last.pt", weights_only=True)
    state["format_version"] = 99
    torch.save(state, work / "new.pt")


def break_offsets_without_checksums(data_dir):
    merge_two_sentences(data_dir)
    path = data_dir / "train.src.idx.npy"
    offsets = np.load(path)
    offsets[-1] += 5
    np.save(path, offsets)
    edit_meta(data_dir, checksums=None)


# (id, setup(work) or None, args (strings with {w} for the work dir, {other} for other_data_bin), expected)
CASES = [
    (
        "generate-data-of-another-vocabulary",
        None,
        "generate {other} --path {w}/run/checkpoint_last.pt --gen-subset test",
        "is not the sentencepiece model of",
    ),
    (
        "generate-data-of-the-other-direction",
        reversed_data,
        "generate {w}/reversed --path {w}/run/checkpoint_last.pt --gen-subset test",
        "was trained src->tgt but",
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
        "generate-token-id-beyond-the-vocabulary",
        lambda w: id_beyond_the_vocabulary(w / "data", "valid"),
        "generate {w}/data --path {w}/run/checkpoint_last.pt --gen-subset valid",
        "valid.tgt.bin.npy: sentence 2 holds token id 60000",
    ),
    (
        "corrupted-idx-without-checksums",
        lambda w: break_offsets_without_checksums(w / "data"),
        "generate {w}/data --path {w}/run/checkpoint_last.pt --gen-subset train",
        "records no checksums of its offsets files",  # had read on, and noticed only the last offset
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
]


@pytest.mark.parametrize("case_id,setup,args,expected", CASES, ids=[c[0] for c in CASES])
def test_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus):
    check_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus)


def test_invalid_utf8_on_stdin(tiny_checkpoint, tmp_path):
    # in this process: the subject is how generate decodes the bytes of stdin, not the process (closed stdin is)
    r = nmt(
        "generate",
        "--path",
        tiny_checkpoint,
        "--input",
        "-",
        "--buffer-size",
        2,
        input=b"1 2\n3 4\n5 6\n7 \xc3\x28 8\n9\n",
    )
    assert_clean_failure(r.exit_code, r.output, "stdin:4: invalid UTF-8", tmp_path, exception=r.exception)
    assert len(r.stdout.splitlines()) == 2, "the first buffer is translated, nothing of the bad one"


def test_closed_stdin(tiny_checkpoint, tmp_path):
    r = nmt_subprocess("generate", "--path", tiny_checkpoint, "--input", "-", shell_suffix=" <&-")
    assert_clean_failure(r.returncode, r.stderr.decode(), "stdin is closed", tmp_path)


# translating the first buffer signals the process (the results file is open, half written)
SIGNAL_IN_GENERATE = """
import nmt_cli.commands.generate as command
real_translate = command.translate
def translate(*args, **kwargs):
    os.kill(os.getpid(), SIG)
    time.sleep(5)
command.translate = translate
"""


def test_a_signal_while_generating_into_results_path_stops_cleanly(work):
    results = work / "results"
    r = driven(
        SIGNAL_IN_GENERATE,
        "SIGTERM",
        *("generate", work / "data", "--path", work / "run" / "checkpoint_last.pt", "--results-path", results),
    )
    assert_clean_failure(r.returncode, r.stderr.decode(), "stopped by SIGTERM", work)
    assert list(results.iterdir()) == []
