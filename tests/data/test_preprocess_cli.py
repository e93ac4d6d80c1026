"""`nmt preprocess` through the CLI: the happy path on a slice of onmt-sample, and every bad input."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SHARED_DATA

from nmt_cli.cli import cli

SAMPLE = SHARED_DATA / "onmt-sample"


@pytest.fixture
def raw(tmp_path):
    """300 training and 40 valid lines of onmt-sample, or a skip when the shared data is absent."""
    if not (SAMPLE / "train.en").exists():
        pytest.skip(f"shared corpus {SAMPLE} is not on this machine")
    for split, n in (("train", 300), ("valid", 40)):
        for lang in ("en", "de"):
            lines = (SAMPLE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (tmp_path / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


def run(*args):
    return CliRunner().invoke(cli, ["preprocess", "-s", "en", "-t", "de", *map(str, args)])


def test_happy_path(raw):
    dest = raw / "bin"
    result = run(
        "--trainpref",
        raw / "train",
        "--validpref",
        raw / "valid",
        "--testpref",
        raw / "valid",
        "--destdir",
        dest,
        "--vocab-size",
        500,
        "--max-len-ratio",
        3,
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((dest / "meta.json").read_text())
    assert meta["vocab_size"] % 8 == 0 and meta["n_pieces"] == 500
    assert meta["splits"]["valid"]["pairs"] == 40 and meta["splits"]["test"]["pairs"] == 40
    dropped = meta["splits"]["train"]["dropped"]
    assert meta["splits"]["train"]["pairs"] + sum(dropped.values()) == 300
    for name in ("spm.model", "vocab.txt", "train.en.bin.npy", "train.de.idx.npy", "valid.de.bin.npy"):
        assert (dest / name).exists()
    assert not [p for p in raw.iterdir() if p.name.startswith(".bin.tmp")]


def test_existing_spm_model_is_reused(raw, toy_data_bin):
    result = run("--trainpref", raw / "train", "--destdir", raw / "bin2", "--spm-model", toy_data_bin / "spm.model")
    assert result.exit_code == 0, result.output
    assert (raw / "bin2" / "spm.model").read_bytes() == (toy_data_bin / "spm.model").read_bytes()


@pytest.mark.parametrize(
    "options, message",
    [
        (["--vocab-size", "100"], "--vocab-size train a sentencepiece model, and --spm-model gives one"),
        (["--model-type", "unigram", "--character-coverage", "0.99"], "--model-type and --character-coverage"),
        (["--tree-leaves", "slot"], "--tree-leaves is for --target-format ptb-tree"),
    ],
)
def test_options_that_would_be_ignored_are_refused(raw, toy_data_bin, options, message):
    spm = [] if "--tree-leaves" in options else ["--spm-model", toy_data_bin / "spm.model"]
    result = run("--trainpref", raw / "train", "--destdir", raw / "bin2", *spm, *options)
    assert result.exit_code == 1 and message in result.output, result.output
    assert not (raw / "bin2").exists()


def test_subword_split_training_text_is_pointed_out(raw):
    """fairseq's preprocess takes BPE'd text; nmt's wants raw text (else outputs keep the marks)."""
    result = run("--trainpref", raw / "train", "--destdir", raw / "plain", "--vocab-size", 500)
    assert result.exit_code == 0 and "WARNING" not in result.output, result.output
    bpe = [
        " ".join(w[:3] + "@@ " + w[3:] if len(w) > 4 else w for w in line.split()) for line in (raw / "train.en").open()
    ]
    (raw / "bpe.en").write_text("\n".join(bpe) + "\n")
    (raw / "bpe.de").write_text((raw / "train.de").read_text())
    result = run("--trainpref", raw / "bpe", "--destdir", raw / "bin2", "--vocab-size", 500)
    assert result.exit_code == 0, result.output
    assert "bpe.en: 300 of its first 300 lines hold subword-nmt BPE (@@ )" in result.output
    assert [line for line in result.output.splitlines() if "WARNING" in line and "bpe.de" in line] == []


def test_missing_file(raw):
    result = run("--trainpref", raw / "nope", "--destdir", raw / "bin")
    assert result.exit_code == 1
    assert f"{raw / 'nope.en'} does not exist" in result.output
    assert not (raw / "bin").exists()


def test_unequal_line_counts(raw):
    (raw / "train.de").write_text("".join((raw / "train.de").read_text().splitlines(keepends=True)[:-3]))
    result = run("--trainpref", raw / "train", "--destdir", raw / "bin")
    assert result.exit_code == 1
    assert "train.en has 300 lines" in result.output and "train.de has 297" in result.output
    assert not (raw / "bin").exists()


def test_invalid_utf8_names_file_and_line(raw):
    lines = (raw / "train.en").read_bytes().split(b"\n")
    lines[6] = b"caf\xe9 au lait"
    (raw / "train.en").write_bytes(b"\n".join(lines))
    result = run("--trainpref", raw / "train", "--destdir", raw / "bin")
    assert result.exit_code == 1
    assert "train.en:7: invalid UTF-8" in result.output


def test_empty_lines_dropped_from_train_kept_in_valid(raw):
    for split in ("train", "valid"):
        lines = (raw / f"{split}.de").read_text().splitlines()
        lines[3] = ""
        (raw / f"{split}.de").write_text("\n".join(lines) + "\n")
    result = run(
        "--trainpref",
        raw / "train",
        "--validpref",
        raw / "valid",
        "--destdir",
        raw / "bin",
        "--vocab-size",
        500,
        "--max-len-ratio",
        100,
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((raw / "bin" / "meta.json").read_text())
    assert meta["splits"]["train"]["dropped"]["empty"] == 1
    assert meta["splits"]["valid"]["pairs"] == 40

    from nmt_cli.data.dataset import ParallelDataset

    valid = ParallelDataset(raw / "bin", "valid")
    assert len(valid.tgt[3]) == 0 and len(valid.tgt[4]) > 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_destdir_as_user(raw):
    locked = raw / "locked"
    locked.mkdir(mode=0o500)
    result = run("--trainpref", raw / "train", "--destdir", locked / "bin")
    assert result.exit_code == 1 and "cannot write --destdir" in result.output


def test_unwritable_destdir(raw):
    blocker = raw / "file"
    blocker.write_text("x")
    result = run("--trainpref", raw / "train", "--destdir", blocker / "bin")
    assert result.exit_code == 1
    assert f"cannot write --destdir {blocker / 'bin'}" in result.output


def test_existing_destdir_is_not_overwritten(raw):
    (raw / "bin").mkdir()
    (raw / "bin" / "keep.txt").write_text("mine")
    result = run("--trainpref", raw / "train", "--destdir", raw / "bin")
    assert result.exit_code == 1 and "already exists" in result.output
    assert (raw / "bin" / "keep.txt").read_text() == "mine"


def test_vocab_size_too_large(raw):
    result = run("--trainpref", raw / "train", "--destdir", raw / "bin", "--vocab-size", 100000)
    assert result.exit_code == 1
    assert "--vocab-size 100000 is too large" in result.output and "at most" in result.output
    assert not (raw / "bin").exists()
    assert not [p for p in raw.iterdir() if p.name.startswith(".bin.tmp")]


def test_same_languages(raw):
    result = CliRunner().invoke(
        cli, ["preprocess", "-s", "en", "-t", "en", "--trainpref", raw / "train", "--destdir", raw / "bin"]
    )
    assert result.exit_code == 1 and "--source-lang and --target-lang are both 'en'" in result.output


def test_unknown_option_value(raw):
    result = run("--trainpref", raw / "train", "--destdir", raw / "bin", "--model-type", "word")
    assert result.exit_code == 2 and "--model-type" in result.output


def test_error_is_one_line_without_traceback(raw):
    result = run("--trainpref", raw / "nope", "--destdir", raw / "bin")
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_destdir_dot_is_the_empty_current_directory(raw, monkeypatch):
    """`--destdir .` put its lock file inside `.` and then refused `.` as not empty."""
    here = raw / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    result = run("--trainpref", raw / "train", "--destdir", ".", "--vocab-size", 200)
    assert result.exit_code == 0, result.output
    assert (here / "meta.json").is_file() and sorted(p.name for p in raw.iterdir() if p.name.startswith(".")) == []


def test_a_stray_carriage_return_inside_a_line_keeps_the_pairs_aligned(raw, toy_data_bin):
    """Text mode split a line at a lone "\r" (WMT's crawled corpora have them): every later pair was shifted
    by one, without a word, as the line counts (at "\n") agreed."""
    lines = (raw / "train.en").read_text(encoding="utf-8").split("\n")
    lines[1] = lines[1].replace(" ", " \r", 1).replace(" ", " \u2028", 1)
    (raw / "dirty.en").write_bytes("\n".join(lines).encode())
    (raw / "dirty.de").write_bytes((raw / "train.de").read_bytes())
    common = ["--spm-model", toy_data_bin / "spm.model", "--max-len-ratio", 100]
    assert run("--trainpref", raw / "train", "--destdir", raw / "clean-bin", *common).exit_code == 0
    result = run("--trainpref", raw / "dirty", "--destdir", raw / "dirty-bin", *common)
    assert result.exit_code == 0, result.output
    clean, dirty = (
        json.loads((raw / d / "meta.json").read_text())["splits"]["train"] for d in ("clean-bin", "dirty-bin")
    )
    assert dirty["pairs"] == clean["pairs"] == 300
    for lang in ("en", "de"):  # every pair after the dirty line as in the clean corpus
        (clean_tokens, clean_idx), (dirty_tokens, dirty_idx) = (
            (np.load(raw / d / f"train.{lang}.bin.npy"), np.load(raw / d / f"train.{lang}.idx.npy"))
            for d in ("clean-bin", "dirty-bin")
        )
        assert (clean_tokens[clean_idx[2] :] == dirty_tokens[dirty_idx[2] :]).all()
