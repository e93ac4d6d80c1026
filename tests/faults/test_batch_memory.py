"""A batch's search memory is bounded by what will run: its rows (sentences x beam, each at its longest output), not
one one-piece sentence's. generate (and score-pairs, by its teacher-forced pass) splits a batch so that its rows fit
in the memory available, or refuses, where even one sentence cannot fit, with one line naming --beam and --max-tokens
(search/settings.py). `--beam 100000` on 20 sentences had passed the check of one sentence and run for minutes
while its memory grew past the machine's."""

import os
import resource
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import nmt

from nmt_cli.checkpoint.saved import read_saved_model
from nmt_cli.commands import generate as generate_module
from nmt_cli.commands import score_pairs as score_pairs_module
from nmt_cli.config import ServeConfig
from nmt_cli.errors import ConfigError
from nmt_cli.search.settings import pass_memory, search_bounds, search_memory
from nmt_cli.serve import batch_search, request
from nmt_cli.serve.models import Models, key_of
from nmt_cli.steps import run_to_end

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["1 2 3 4 5 6 7 8 9", "4 5", "6 7 8", "1", "2 3 4 5", "9 9 9 9 9 9", "0 1", "3 3 3"]


def bounds_and_longest(ckpt: Path, lines: list[str]):
    saved = read_saved_model(ckpt)
    longest = max(len(ids) for ids in saved.vocab.encode_arrays(lines))
    return saved, search_bounds(saved.config, torch.device("cpu"), "fp32"), longest


def batch_sizes(monkeypatch, module, function: str, position: int) -> list[int]:
    """The batch_size each call of module.function is given (its argument at `position`, or its SearchRequest's)."""
    seen: list[int] = []
    original = getattr(module, function)

    def recorded(*args, **kwargs):
        seen.append(args[position] if position < len(args) else args[1].batch_size)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, function, recorded)
    return seen


def test_generate_splits_a_batch_so_that_its_rows_fit(trained_copy_checkpoint, tmp_path, monkeypatch):
    """A model that has learned its task: decisive beams, whose outputs do not depend on the batch."""
    tiny_checkpoint = trained_copy_checkpoint
    source = tmp_path / "src.txt"
    source.write_text("\n".join(SOURCES) + "\n")
    words = ["generate", "--path", tiny_checkpoint, "--input", source, "--beam", 4, "--nbest", 2]
    whole = nmt(*words)
    assert whole.exit_code == 0, whole.output
    saved, bounds, longest = bounds_and_longest(tiny_checkpoint, SOURCES)
    need = search_memory(replace(saved.search, beam=4, nbest=2), bounds, longest)
    monkeypatch.setattr(generate_module, "available_memory", lambda device: 3 * need + 1)  # three sentences' rows
    seen = batch_sizes(monkeypatch, generate_module, "translate", 2)  # the request's
    split = nmt(*words)
    assert split.exit_code == 0, split.output
    assert seen == [3] and split.stdout == whole.stdout
    seen.clear()
    assert nmt(*words, "--batch-size", 2).stdout == whole.stdout and seen == [2]  # a lower --batch-size stays


def test_generate_refuses_a_sentence_whose_rows_alone_cannot_fit(tiny_checkpoint, tmp_path, monkeypatch):
    """The check of the settings (a one-piece sentence) passes; the input's longest sentence does not fit."""
    source = tmp_path / "src.txt"
    source.write_text("\n".join(SOURCES) + "\n")
    saved, bounds, longest = bounds_and_longest(tiny_checkpoint, SOURCES)
    need = search_memory(replace(saved.search, beam=4), bounds, longest)
    assert search_memory(replace(saved.search, beam=4), bounds) < need - 1
    monkeypatch.setattr(generate_module, "available_memory", lambda device: need - 1)
    r = nmt("generate", "--path", tiny_checkpoint, "--input", source, "--beam", 4)
    assert r.exit_code == 1 and r.stdout == "", r.output
    assert r.stderr.startswith(f"error: --beam 4 cannot fit: searching even one sentence of {longest} pieces with 4 ")
    assert "--max-tokens splits a batch down to one sentence" in r.stderr
    assert r.stderr.rstrip().endswith("give a smaller --beam") and r.stderr.count("\n") == 1, r.stderr


def test_score_pairs_splits_a_batch_so_that_its_passes_fit(trained_copy_checkpoint, tmp_path, monkeypatch):
    tiny_checkpoint = trained_copy_checkpoint
    source, target = tmp_path / "src.txt", tmp_path / "tgt.txt"
    source.write_text("\n".join(SOURCES) + "\n")
    target.write_text("\n".join(reversed(SOURCES)) + "\n")
    words = ["score-pairs", "--path", tiny_checkpoint, "--source", source, "--target", target]
    whole = nmt(*words)
    assert whole.exit_code == 0, whole.output
    _, bounds, longest = bounds_and_longest(tiny_checkpoint, SOURCES)
    monkeypatch.setattr(score_pairs_module, "available_memory", lambda device: 2 * pass_memory(bounds, longest + 1))
    seen = batch_sizes(monkeypatch, score_pairs_module, "forced_scores", 5)
    split = nmt(*words)
    assert split.exit_code == 0, split.output
    assert seen == [2] and split.stdout == whole.stdout


def test_a_beam_of_100000_on_20_sentences_is_refused_at_once_in_little_memory(toy_corpus, tiny_checkpoint, tmp_path):
    """A real process whose address space is limited (`ulimit -v`, which the memory available counts): with outputs
    of up to 10 pieces per input piece a one-piece sentence's rows fit, the input's longest sentences' do not. It
    is refused in seconds of CPU time (the wall clock depends on what else the machine runs), its peak RSS far
    below the limit; it had allocated until the limit stopped it with a traceback."""
    lines = (toy_corpus / "test.src").read_text().splitlines()[:20]
    source = tmp_path / "src.txt"
    source.write_text("\n".join(lines) + "\n")
    limit = 5 * 2**29  # 2.5 GiB of address space: torch and the model take about 0.6
    command = [sys.executable, "-m", "nmt_cli", "generate", "--path", str(tiny_checkpoint), "--input", str(source),
               "--device", "cpu", "--threads", "1", "--beam", "100000", "--max-len-a", "10", "--max-len-b", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    timer = threading.Timer(300, process.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak RSS, not every child's of pytest
    finally:
        timer.cancel()
    out, err = process.stdout.read().decode(), process.stderr.read().decode()
    process.stdout.close()
    process.stderr.close()
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 1 and out == "" and "Traceback" not in err, err
    assert err.startswith("error: --beam 100000 cannot fit: searching even one sentence of ") and err.count("\n") == 1
    assert "--max-tokens" in err and err.rstrip().endswith("give a smaller --beam"), err
    assert usage.ru_maxrss * 1024 < 2**31, usage.ru_maxrss  # KiB: under 2 GiB
    assert usage.ru_utime + usage.ru_stime < 30, usage


def test_serve_splits_a_batch_so_that_its_rows_fit(trained_copy_checkpoint, monkeypatch):
    """The server's worker splits a batch as generate does, by the memory the device has when the batch starts."""
    models = Models.open(ServeConfig(path=str(trained_copy_checkpoint), device="cpu", threads=1), {})
    served = models.default.served
    key = key_of(models.default, served.search)
    whole = run_to_end(models.run(key, served.reader.prepare(SOURCES), None, None))
    _, bounds, longest = bounds_and_longest(trained_copy_checkpoint, SOURCES)
    need = search_memory(served.search, bounds, longest)
    monkeypatch.setattr(batch_search, "available_memory", lambda device: 3 * need + 1)  # three sentences' rows
    seen = batch_sizes(monkeypatch, batch_search, "translate_steps", 9)  # the request's
    assert run_to_end(models.run(key, served.reader.prepare(SOURCES), None, None)) == whole and seen == [3]


def test_serve_refuses_a_request_whose_longest_sentence_cannot_fit(tiny_checkpoint, monkeypatch):
    """Refused when read, in the request's words (`beam`), before it reaches the worker."""
    reader = Models.open(ServeConfig(path=str(tiny_checkpoint), device="cpu", threads=1), {}).default.served.reader
    saved, bounds, longest = bounds_and_longest(tiny_checkpoint, SOURCES)
    need = search_memory(replace(saved.search, beam=4), bounds, longest)
    monkeypatch.setattr(request, "available_memory", lambda device: need - 1)
    reader.read(SOURCES[1:2], {"beam": 4}, {})  # a shorter one fits
    with pytest.raises(ConfigError, match=rf"^beam 4 cannot fit: searching even one sentence of {longest} pieces"):
        reader.read(SOURCES, {"beam": 4}, {})
