"""The cases next to the fault suite's that must end in a correct result: missing output directories are
created, over-long pairs are skipped and counted, vocabulary padding ids never come out of search, and
checkpoints keep their numbering and their tied weights."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, nmt

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.config import SearchConfig
from nmt_cli.data.dataset import load_vocab
from nmt_cli.files import atomic_write_text, run_lock
from nmt_cli.model.transformer import build_model
from nmt_cli.search.beam import constrain
from nmt_cli.search.translate import SearchRequest, Translator, translate

ROOT = Path(__file__).resolve().parents[2]


def test_output_files_in_missing_directories_are_created(tiny_checkpoint, tmp_path):
    out = tmp_path / "a" / "b" / "avg.pt"
    r = nmt(
        "average-checkpoints",
        "--inputs",
        tiny_checkpoint.parent / "checkpoint_4.pt",
        tiny_checkpoint.parent / "checkpoint_6.pt",
        "--output",
        out,
    )
    assert r.exit_code == 0, r.output
    assert load_checkpoint(out)["averaged_from"]


def test_log_file_in_a_missing_directory_and_over_long_pairs(toy_data_bin, tmp_path):
    log = tmp_path / "logs" / "train.jsonl"
    r = nmt(
        "train",
        toy_data_bin,
        "--save-dir",
        tmp_path / "run",
        *TINY,
        "--max-update",
        2,
        "--max-positions",
        8,
        "--log-file",
        log,
        "--validate-interval-updates",
        2,
    )
    assert r.exit_code == 0, r.output
    assert [json.loads(line)["update"] for line in log.read_text().splitlines()][:2] == [1, 2]
    assert "training pairs are longer than --max-positions 8 allows" in r.output and "skips them" in r.output
    assert "valid pairs are longer than --max-positions 8" in r.output


def test_pairs_longer_than_max_tokens_are_counted(toy_data_bin, tmp_path):
    """A batch of one pair must fit --max-tokens: training skips longer pairs, and says how many."""
    r = nmt("train", toy_data_bin, "--save-dir", tmp_path / "run", *TINY, "--max-update", 1, "--max-tokens", 8)
    assert r.exit_code == 0, r.output
    assert "training pairs are longer than --max-tokens 8 allows" in r.output and "skips them" in r.output


def test_training_without_a_valid_split_says_so(toy_data_bin, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(toy_data_bin, data)
    meta = json.loads((data / "meta.json").read_text())
    del meta["splits"]["valid"]
    (data / "meta.json").write_text(json.dumps(meta))
    r = nmt("train", data, "--save-dir", tmp_path / "run", *TINY, "--max-update", 2)
    assert r.exit_code == 0, r.output
    assert "has no valid split: training runs without validation and writes no checkpoint_best.pt" in r.output
    assert (tmp_path / "run" / "checkpoint_last.pt").exists() and not (tmp_path / "run" / "checkpoint_best.pt").exists()


def test_a_save_dir_keeps_files_nmt_did_not_write(toy_data_bin, tmp_path):
    """Only what a killed save leaves is cleaned up: a user's own *.tmp in --save-dir stays."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.tmp").write_text("mine")
    (run / "checkpoint_last.pt.tmp").write_bytes(b"half a checkpoint")
    r = nmt("train", toy_data_bin, "--save-dir", run, *TINY, "--max-update", 1)
    assert r.exit_code == 0, r.output
    assert (run / "notes.tmp").read_text() == "mine" and not (run / "checkpoint_last.pt.tmp").exists()


def test_search_never_emits_vocabulary_padding_ids(toy_data_bin):
    log_probs = torch.zeros(2, 32)
    log_probs[:, 30] = 5.0
    out = constrain(log_probs, 1, torch.tensor([9, 9]), SearchConfig(), n_pieces=24, may_reach_max=True)
    assert torch.isinf(out[:, 24:]).all() and int(out.argmax(-1)[0]) < 24

    vocab = load_vocab(toy_data_bin)
    torch.manual_seed(0)
    model = build_model_with_rows(vocab.n_pieces + 8).eval()
    with torch.no_grad():
        model.output.weight[vocab.n_pieces :] = 0.0
        model.output.weight[vocab.n_pieces + 3] = 50.0 * model.output.weight.abs().max()  # the likeliest row
    translator = Translator(model, vocab, torch.device("cpu"))
    sources = [np.array(vocab.encode(["1 2 3"])[0])]
    for cfg in (SearchConfig(beam=3), SearchConfig(beam=1), SearchConfig(sampling=True, beam=1, seed=1)):
        hyps = translate(translator, SearchRequest(sources, cfg, 256))
        assert all(t < vocab.n_pieces for t in hyps[0][0].tokens), (cfg, hyps[0][0].tokens)


def build_model_with_rows(n_rows):
    from dataclasses import replace

    from nmt_cli.config import ARCHITECTURES

    return build_model(replace(ARCHITECTURES["transformer_tiny"], vocab_size=n_rows, dropout=0.0))


def test_reset_lr_scheduler_keeps_numbering_and_keep_last(toy_data_bin, tmp_path):
    args = ["train", toy_data_bin, "--save-dir", tmp_path, *TINY, "--save-interval-updates", 2, "--keep-last", 2]
    assert nmt(*args, "--max-update", 4).exit_code == 0
    r = nmt(*args, "--max-update", 8, "--reset-lr-scheduler")
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in tmp_path.glob("checkpoint_*.pt") if p.stem[11:].isdigit())
    assert names == ["checkpoint_6.pt", "checkpoint_8.pt"]
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert state["update"] == 8 and state["train_state"]["lr_start"] == 4


def test_averaged_tied_weights_are_stored_once(tiny_checkpoint, tmp_path):
    out = tmp_path / "avg.pt"
    ckpt_dir = tiny_checkpoint.parent
    assert (
        nmt(
            "average-checkpoints",
            "--inputs",
            ckpt_dir / "checkpoint_4.pt",
            ckpt_dir / "checkpoint_6.pt",
            "--output",
            out,
        ).exit_code
        == 0
    )
    avg = torch.load(out, weights_only=True)["model"]
    tied = [n for n in avg if n.endswith("weight") and ("embed" in n and "tokens" in n or n == "output.weight")]
    ptrs = {avg[n].untyped_storage().data_ptr() for n in tied}
    assert len(tied) >= 2 and len(ptrs) == 1, tied
    untied = tmp_path / "untied.pt"  # the same checkpoint with each tied name holding its own copy
    state = torch.load(out, weights_only=True)
    state["model"] = {k: v.clone() for k, v in state["model"].items()}
    torch.save(state, untied)
    assert n_storages(untied) - n_storages(out) == len(tied) - 1  # the embedding is written once, not 3 times


def n_storages(path):
    import zipfile

    with zipfile.ZipFile(path) as z:
        return sum("/data/" in name and not name.endswith("/") for name in z.namelist())


def test_lock_is_exclusive_and_released(tmp_path):
    lock = tmp_path / ".nmt.lock"
    with run_lock(lock, "train", tmp_path):
        assert lock.read_text().strip() == str(os.getpid())
        code = (
            "from pathlib import Path; from nmt_cli.files import run_lock, BusyError\n"
            f"try:\n    run_lock(Path({str(lock)!r}), 'train', Path('.')).__enter__()\n"
            "except BusyError as e:\n    print(e)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        ).stdout
        assert f"(pid {os.getpid()})" in out
    assert not lock.exists()
    with run_lock(lock, "train", tmp_path):  # and can be taken again
        pass


def test_a_read_only_directory_is_one_error_not_the_clean_up_s_traceback(tmp_path, monkeypatch):
    """Writing into a read-only directory failed, then so did removing the temporary file, and that second error
    escaped as chained tracebacks (generate --results-path, average-checkpoints --output on a read-only mount)."""
    import errno

    from nmt_cli import files
    from nmt_cli.errors import NmtError

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files, "open_held", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)  # as a read-only mount refuses it (root writes where chmod says no)
    refused = pytest.raises(NmtError, match=r"cannot write --results-path file .*out.txt: Read-only file system")
    with refused, files.atomic_text_output(tmp_path / "out.txt", "--results-path file"):
        pass


def test_atomic_write_keeps_the_old_file_on_error(tmp_path):
    path = tmp_path / "config.json"
    atomic_write_text(path, "old")

    class Boom(Exception):
        pass

    from nmt_cli.files import atomic_write

    def write(f):
        f.write(b"half")
        raise Boom()

    with pytest.raises(Boom):
        atomic_write(path, write)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


@pytest.mark.parametrize("existing", [True, False])
def test_text_output_on_a_full_disk_says_what_is_left(tmp_path, existing):
    """`generate --output` and the other text outputs: a full disk leaves the previous file as it was (or none)
    and says so; no temporary stays behind."""
    import errno

    from nmt_cli.files import DiskFullError, atomic_text_output

    path = tmp_path / "hyp.txt"
    if existing:
        path.write_text("old\n")
    with pytest.raises(DiskFullError) as raised, atomic_text_output(path, "--output") as f:
        f.write("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    left = "the previous --output is intact" if existing else "nothing was written"
    assert str(raised.value) == f"no space left on device writing {path}; {left}"
    assert sorted(p.name for p in tmp_path.iterdir()) == (["hyp.txt"] if existing else [])
    assert not existing or path.read_text() == "old\n"


def test_a_signal_while_a_log_line_is_formatted_still_stops_the_write(tmp_path):
    """logging's handlers catch Exception: a SIGTERM that landed while preprocess formatted a log line printed
    "--- Logging error ---" with a traceback, and the write went on. Interrupted is a BaseException now."""
    import logging
    import os
    import signal

    from nmt_cli.signals import Interrupted, stop_on_signals

    class Signalling(logging.Formatter):
        def format(self, record):
            os.kill(os.getpid(), signal.SIGTERM)
            return super().format(record)

    logger = logging.getLogger("test-signal-in-logging")
    handler = logging.StreamHandler()
    handler.setFormatter(Signalling())
    logger.addHandler(handler)
    try:
        with pytest.raises(Interrupted, match="stopped by SIGTERM; the test"), stop_on_signals("the test"):
            logger.warning("a line")
            raise AssertionError("the signal did not stop the block")
    finally:
        logger.removeHandler(handler)
