"""gpu_check.sh's fairseq step (benchmarks/bench_fairseq.py): its closing-table rows from recorded figures and
the fairseq binary files it writes always; the step's CPU dry run where fairseq imports (the CPU twin of
benchmarks/fairseq-bundle/README.md, or any Python with fairseq installed): the fast suite needs neither
fairseq nor a network."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_fairseq  # noqa: E402

HAS_FAIRSEQ = importlib.util.find_spec("fairseq_cli") is not None


def table(tmp_path, results: list[dict]) -> str:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check_table.py"), str(out), str(work), "512"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_table_has_the_ratio_to_fairseqs_faster_precision_and_nmts_variants(tmp_path):
    """Lines as bench_fairseq.py records them: the ratio is nmt's plain run over fairseq's faster precision."""
    speed = [
        ("fairseq", "", "fp16", 200000, 24100, 9.4),
        ("nmt", "", "bf16", 300000, 24500, 8.1),
        ("fairseq", "", "bf16", 150000, 24100, 9.0),
        ("nmt", "--bucket-shapes", "bf16", 330000, 24600, 8.3),
        ("nmt", "Triton loss off", "bf16", 240000, 24500, 9.9),
    ]
    results = [
        dict(what="speed transformer_base", toolkit=t, variant=v, precision=p, target_tok_s=s, tokens_per_update=n)
        | dict(peak_gib=g)
        for t, v, p, s, n, g in speed
    ]
    results += [
        dict(what="speed transformer_big", toolkit="nmt", variant="", precision="bf16", target_tok_s=180000)
        | dict(tokens_per_update=24000, peak_gib=20.5),
        dict(what="speed transformer_big", toolkit="fairseq", precision="fp16", target_tok_s=200000)
        | dict(tokens_per_update=23900, peak_gib=22.0),
        dict(what="speed transformer_big", toolkit="fairseq", precision="bf16", failed="fairseq-train exit 1"),
        {"step": "fairseq", "seconds": 140, "rc": 0},
        dict(what="quality multi30k", toolkit="nmt", updates=1500, precision="bf16", bleu=36.21, train_s=31.5),
        dict(what="quality multi30k", toolkit="fairseq", updates=1500, precision="fp16", bleu=35.9, train_s=48.0),
        {"step": "fairseq-quality", "seconds": 150, "rc": 1},
    ]
    text = table(tmp_path, results)
    assert (
        "| nmt vs fairseq transformer_base | nmt 300,000 target tok/s (bf16, 24,500 tokens/update, 8.1 GiB), "
        "fairseq 200,000 (--fp16, 24,100 tokens/update, 9.4 GiB): **1.50x**; fairseq --bf16 150,000 |" in text
    )
    assert (
        "| nmt vs fairseq transformer_big | " in text
        and "**0.90x**; fairseq --bf16 failed (fairseq-train exit 1) |" in text
    )
    assert "| nmt transformer_base --bucket-shapes | 330,000 target tok/s (1.10x without), 8.3 GiB |" in text
    assert "| nmt transformer_base Triton loss off | 240,000 target tok/s (0.80x without), 9.9 GiB |" in text
    assert (
        "| Multi30k BLEU at equal updates | nmt 36.21 (1,500 bf16 updates in 31.5 s), fairseq 35.9 (1,500 fp16 "
        "updates in 48.0 s) (sacreBLEU, beam 4, test_2016_flickr) |" in text
    )
    assert "| fairseq time | speed 140 s; quality failed: exit 1 after 150 s |" in text


def test_table_says_when_the_fairseq_step_did_not_run(tmp_path):
    failed = dict(what="speed transformer_tiny", toolkit="fairseq", precision="fp32", failed="fairseq-train exit 1")
    nmt = dict(what="speed transformer_tiny", toolkit="nmt", variant="", precision="fp32", target_tok_s=9000)
    text = table(tmp_path, [failed, nmt | dict(tokens_per_update=400, peak_gib=0.0)])
    assert (
        "| nmt vs fairseq transformer_tiny | nmt 9,000 target tok/s; fairseq --fp32 failed (fairseq-train exit 1) |"
        in text
    )
    (tmp_path / "skipped").mkdir()
    text = table(tmp_path / "skipped", [{"step": "fairseq", "skipped": "no fairseq wheel in .whl"}])
    assert "| fairseq time | speed skipped: no fairseq wheel in .whl; quality not run |" in text
    assert "nmt vs fairseq" not in text and "BLEU at equal updates" not in text


def test_fairseq_split_holds_nmts_ids_with_eos_and_fairseqs_unk(tmp_path):
    """The index fairseq's MMapIndexedDataset reads (magic, version, dtype code, count, int32 sizes, int64
    byte pointers) and the tokens: nmt's ids, unk (1) as fairseq's 3, EOS (2) after every sentence."""
    sentences = [[5, 6, 7], [1, 9], [4]]
    for lang in ("en", "de"):
        np.save(tmp_path / f"train.{lang}.bin.npy", np.array(sum(sentences, []), dtype=np.uint16))
        np.save(tmp_path / f"train.{lang}.idx.npy", np.array([0, 3, 5, 6], dtype=np.int64))
    bench_fairseq.write_fairseq_split(tmp_path, "train", ("en", "de"), tmp_path, ("en", "de"))
    index = (tmp_path / "train.en-de.de.idx").read_bytes()
    assert index[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<QBQ", index[9:26]) == (1, 8, 3)
    sizes = np.frombuffer(index[26 : 26 + 12], dtype=np.int32)
    pointers = np.frombuffer(index[38:], dtype=np.int64)
    assert sizes.tolist() == [4, 3, 2] and pointers.tolist() == [0, 8, 14]
    tokens = np.fromfile(tmp_path / "train.en-de.de.bin", dtype=np.uint16)
    assert tokens.tolist() == [5, 6, 7, 2, 3, 9, 2, 4, 2]
    if HAS_FAIRSEQ:  # and fairseq's own reader agrees
        from fairseq.data.indexed_dataset import MMapIndexedDataset

        dataset = MMapIndexedDataset(str(tmp_path / "train.en-de.en"))
        assert [dataset[i].tolist() for i in range(3)] == [[5, 6, 7, 2], [3, 9, 2], [4, 2]]


NO_FAIRSEQ = "fairseq is not importable (benchmarks/fairseq-bundle/README.md: the CPU twin)"


@pytest.mark.parametrize("how", [{}, {"bucket_shapes": True}])
def test_nmts_rows_run_without_fairseq(tmp_path, how):
    """nmt's side of the speed step (bench_gpu.py's training loop, driven with the options this script gives it)
    on the CPU at tiny sizes, so that an option bench_gpu.py gains cannot break the step where only a GPU with
    fairseq would show it."""
    import argparse

    import bench_gpu
    import torch

    data_dir = bench_gpu.synthetic_data_dir(tmp_path, 40, 100)
    args = argparse.Namespace(max_tokens=256, device="cpu", warm=1, meas=2, device_name="cpu", peak=1.0)
    args.torch_device = torch.device("cpu")
    figures = bench_fairseq.nmt_speed("transformer_tiny", data_dir, args, **how)
    assert figures["target_tok_s"] > 0 and figures["tokens_per_update"] > 0


@pytest.mark.skipif(not HAS_FAIRSEQ, reason=NO_FAIRSEQ)
def test_gpu_check_fairseq_step_dry_run(tmp_path):
    """DRY_RUN=1 STEPS=fairseq: fairseq and nmt trained side by side on the CPU at tiny sizes; the rows reach
    the table (the quality half is skipped here for want of Multi30k: the next test runs it)."""
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "out")],
        env={**os.environ, "DRY_RUN": "1", "STEPS": "fairseq", "PYTHON": sys.executable, "RAW_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| nmt vs fairseq transformer_tiny | nmt " in summary and "(--fp32, " in summary, summary
    assert "| nmt transformer_tiny --bucket-shapes | " in summary
    assert "| fairseq time | speed " in summary and "; quality skipped: no Multi30k at RAW_DIR" in summary
    assert len(list((tmp_path / "out").iterdir())) <= 8


@pytest.mark.slow  # six child processes: preprocess, train and translate with each toolkit
@pytest.mark.skipif(not HAS_FAIRSEQ, reason=NO_FAIRSEQ)
def test_bench_fairseq_quality_trains_and_scores_both_on_the_same_pieces(tmp_path):
    raw = ROOT.parent / "shared" / "data" / "multi30k"
    if not (raw / "train.en").exists():
        pytest.skip(f"no Multi30k at {raw}")
    results = tmp_path / "results.jsonl"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_fairseq.py"), "quality", "--device", "cpu"]
        + ["--raw-dir", str(raw), "--work", str(tmp_path / "work"), "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(row["toolkit"], row["updates"], row["precision"]) for row in rows] == [
        ("nmt", 4, "fp32"),
        ("fairseq", 4, "fp32"),
    ]
    assert all(0 <= row["bleu"] <= 100 and row["train_s"] > 0 for row in rows)
    # fairseq read nmt's ids: the same test sentences, 8 of them, translated by each
    assert len((tmp_path / "work" / "nmt.hyp.de").read_text().splitlines()) == 8
