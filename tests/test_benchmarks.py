"""The benchmark scripts that have a tiny mode run in the fast suite, so that none can rot unseen between the
sessions that run them for figures (issue 33: bench_gpu.py crashed on the first GPU run before its first figure):
each runs as a user runs it (a child process) at sizes that take seconds. bench_serve.py's and bench_decoding.py's
tiny modes and gpu_check.sh's CPU dry run take longer and are slow tests."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT


def run_benchmark(script: str, *args: str, tmp_path, timeout: float = 120) -> str:
    env = os.environ | {"NMT_BENCH_RESULTS": str(tmp_path / "results"), "NMT_BENCH_DIR": str(tmp_path / "work")}
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_bench_matmul_prints_both_routes_for_every_product(tmp_path):
    out = run_benchmark("bench_matmul.py", "--rows", "64", "--repeat", "1", tmp_path=tmp_path)
    header, *rows = out.splitlines()[:5]
    assert header.split()[:4] == ["in", "x", "out", "mkl"] and "onednn grad_w" in header
    assert [" ".join(r.split()[:3]) for r in rows] == ["512 x 1536", "512 x 512", "512 x 2048", "2048 x 512"]
    assert "training's float32 products take" in out
    assert (tmp_path / "results" / "matmul.json").exists()


def number(cell: str) -> float:
    """A table's figure: 1,314 (thousands separated, as a fast machine's rates are printed) or 0.02."""
    return float(cell.replace(",", ""))


@pytest.mark.slow  # a generate run per feature this checkout has, and score-pairs: up to 8 child processes
def test_bench_decoding_reports_each_feature_or_that_it_is_not_available(trained_copy_checkpoint, tmp_path):
    ckpt = str(trained_copy_checkpoint)
    args = ("--tiny", "--threads", "1", "--score-repeat", "3", "--path", ckpt)
    out = run_benchmark("bench_decoding.py", *args, tmp_path=tmp_path, timeout=600)
    # a row's cells: seconds, sent/s, x baseline, target, conditions (the empty ones run together)
    rows = {cells[0]: cells[1:] for line in out.splitlines() if len(cells := re.split(r"\s{2,}", line.strip())) > 2}
    baseline = rows["beam 4 (baseline)"]
    assert number(baseline[0]) > 0 and number(baseline[1]) > 0 and baseline[2] == "1.00x time"
    helps = {
        name: subprocess.run(
            [sys.executable, "-m", "nmt_cli", *command, "--help"], capture_output=True, text=True, cwd=ROOT, check=True
        ).stdout
        for name, command in (("generate", ["generate"]), ("nmt", []))
    }
    for feature, command, option in [
        ("ensemble of 2", "generate", "--weights"),
        ("2 constraints", "generate", "--constraints-file"),
        ("target prefix", "generate", "--prefix-file"),
        ("no-repeat-ngram 3", "generate", "--no-repeat-ngram-size"),
        ("alignment hard", "generate", "--print-alignment"),
        ("score-pairs", "nmt", "score-pairs"),
    ]:
        cells = rows[feature]
        if option in helps[command]:
            assert number(cells[0]) > 0 and re.fullmatch(r"\d+\.\d\dx (time|sent/s)", cells[2]), cells
        else:
            assert cells[0] == "not available", cells
    assert "machine: {" in out and (tmp_path / "results" / "decoding.json").exists()
    # score-pairs read the 8 pairs 3 times over: its rate is of 24 sentences, its multiple of the two rates
    seconds, rate, multiple = rows["score-pairs"][:3]
    assert abs(24 / number(rate) - number(seconds)) <= 0.006, rows["score-pairs"]  # seconds printed to 0.01
    base_rate = number(baseline[1])
    assert float(multiple.split("x")[0]) == pytest.approx(number(rate) / base_rate, rel=0.02)
    assert "score-pairs read them 3 times over again" in out


def test_bench_gpu_runs_on_cpu(tmp_path):
    results = tmp_path / "bench.jsonl"
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    r = subprocess.run(
        [sys.executable, "benchmarks/bench_gpu.py", "--device", "cpu", "--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(temporary)},
    )
    # its temporary directories are removed (torch keeps its compiler's cache there, shared between runs)
    assert [p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert r.returncode == 0, r.stderr[-3000:]
    assert "train transformer_tiny" in r.stdout and "generate transformer_tiny beam 4" in r.stdout, r.stdout
    figures = [json.loads(line) for line in results.read_text().splitlines()]
    generate = "generate transformer_tiny beam 4"  # at the budget and in batches of 32, today's search and slots'
    assert [f["what"] for f in figures] == [
        "train transformer_tiny",
        generate,
        f"{generate}, budget, slots",
        f"{generate}, batch 32, default",
        f"{generate}, batch 32, slots",
    ]
    assert figures[0]["target_tok_s"] > 0 and figures[1]["sentences"] == 20
    assert figures[2]["differ"] == figures[4]["differ"] == 0  # the fixed-slot search translates as today's


def test_profile_gpu_generation_runs_on_cpu(tmp_path):
    """--generation: a row per batching and search (graphs skipped without CUDA), steps in a batch's middle."""
    results = tmp_path / "profile.jsonl"
    args = ("--generation", "--device", "cpu", "--sentences", "8", "--steps", "4", "--results", str(results))
    out = run_benchmark("profile_gpu.py", *args, tmp_path=tmp_path)
    generate = "generate transformer_tiny beam 4"
    searched = [
        f"{generate}, {batching}, {search}" for batching in ("budget", "batch 32") for search in ("default", "slots")
    ]
    for what in searched:
        assert f"{what} (fp32): batch 1 of 1, 8 sentences of " in out, out
    for batching in ("budget", "batch 32"):
        assert f"{generate}, {batching}, graphs: skipped (CUDA graphs need CUDA)" in out
    assert "GPU busy n/a, kernel launches n/a (no CUDA)" in out and "none: no CUDA kernels were recorded" in out
    figures = [json.loads(line) for line in results.read_text().splitlines()]
    assert [f["what"] for f in figures] == [f"profile {what}" for what in searched]
    for f in figures:
        first, last = f["profiled_steps"]
        assert last - first == 3 and first > 0 and last < f["decoder_steps"] - 1, f
        assert f["ms_per_step"] > 0 and f["profiled_ms_per_step"] > 0 and f["host_ops_ms_per_step"] > 0
        assert f["gpu_busy"] is f["launches_per_step"] is f["kernels_per_step"] is None and f["kernels_ms"] == []
        ops = {op for _, op, _ in f["host_ops_ms"]}
        # the linears: PyTorch's addmm, or oneDNN's packed linear where the CPU has AVX-512 (model/linear.py)
        assert len(f["host_ops_ms"]) == 10 and "aten::bmm" in ops and ops & {"aten::addmm", "mkldnn::_linear_pointwise"}


@pytest.fixture
def profile_gpu(monkeypatch):
    """benchmarks/profile_gpu.py as a module, benchmarks/ on sys.path for this test only."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("profile_gpu")


def test_profile_gpu_profiles_an_update_with_the_options_asked(tmp_path, monkeypatch, capsys, profile_gpu):
    """--bucket-shapes profiles `nmt train --bucket-shapes`'s update (gpu_check.sh's profile-graphs step adds
    --cuda-graphs on CUDA, which is refused on the CPU with one line: its arguments' check, run in this process)."""
    results = tmp_path / "profile.jsonl"
    args = ("--device", "cpu", "--bucket-shapes", "--warmup", "2", "--updates", "2", "--results", str(results))
    out = run_benchmark("profile_gpu.py", *args, tmp_path=tmp_path)
    assert "transformer_tiny --bucket-shapes: " in out and "ms/update" in out, out
    (figures,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert figures["what"] == "profile transformer_tiny --bucket-shapes" and figures["wall_ms_per_update"] > 0
    monkeypatch.setattr(sys, "argv", ["profile_gpu.py", "--device", "cpu", "--cuda-graphs"])
    with pytest.raises(SystemExit) as refused:
        profile_gpu.parse_args()
    assert refused.value.code == 2 and "--cuda-graphs: CUDA graphs need --device cuda" in capsys.readouterr().err


def test_profile_gpu_counts_kernel_and_graph_launches_apart(profile_gpu):
    """The launch count of a CUDA profile, on events named as the profiler names them (no GPU here)."""
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    names = [
        (cpu, "aten::mm"),
        (cpu, "cudaLaunchKernel"),
        (cpu, "cudaLaunchKernelExC_v11060"),
        (cpu, "cuLaunchKernelEx"),
        (cpu, "cudaGraphLaunch"),
        (cpu, "cudaGraphLaunch_v10000"),
        (cpu, "cudaMemcpyAsync"),
        (cpu, "cudaLaunchHostFunc"),
        (cuda, "nvjet_sm90_tst_128x128"),
        (cuda, "void at::native::vectorized_elementwise_kernel<4>"),
        (cuda, "Memcpy DtoH (Device -> Pinned)"),
        (cuda, "Memset (Device)"),
    ]
    prof = SimpleNamespace(events=lambda: [SimpleNamespace(device_type=d, name=n) for d, n in names])
    assert profile_gpu.launch_counts(prof) == (3, 2, 2)


# profile_gpu.py --generation's figures of a CUDA-graph search step (what it prints and records)
GRAPHS_STEP = {
    "ms_per_step": 4.82,
    "profiled_ms_per_step": 5.1,
    "gpu_busy": 0.41,
    "kernel_ms_per_step": 2.09,
    "launches_per_step": 2.0,
    "graph_launches_per_step": 1.0,
    "kernels_per_step": 402.0,
    "kernels_ms": [[0.61, "nvjet_sm90_tst_64x8"]],
    "host_ops_ms": [[0.35, "cudaGraphLaunch", 1.0]],
}


def test_profile_gpu_shows_a_cuda_search_step(capsys, profile_gpu):
    """A search step's lines from CUDA figures (the CPU run prints its no-CUDA lines): busy, launches, tables."""
    figures = GRAPHS_STEP | {"decoder_steps": 33, "profiled_steps": [12, 21], "host_ops_ms_per_step": 1.2}
    profile_gpu.show_search(
        "generate transformer_base beam 4, budget, graphs (bf16)", "batch 4 of 7, 540 sentences", figures
    )
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "generate transformer_base beam 4, budget, graphs (bf16): batch 4 of 7, 540 sentences, 33 decoder steps; "
        "steps 12-21 profiled",
        "  4.82 ms/step (5.1 under the profiler, 1.2 of it host time in ops); GPU busy 41% (2.09 ms/step of kernels); "
        "per step 2.0 kernel launches, 1.0 graph launches, 402.0 kernels run",
    ]
    assert "      0.610  nvjet_sm90_tst_64x8" in out and "      0.350  cudaGraphLaunch  x1.0" in out
    profile_gpu.show_search("w", "b", figures | {"gpu_busy": None, "kernel_ms_per_step": None})
    assert "GPU busy n/a (no kernel traced); per step 2.0 kernel launches" in capsys.readouterr().out


def test_gpu_check_sh_is_valid_bash():
    r = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_check_table_reads_what_the_steps_leave(tmp_path):
    """The closing table from the files the steps write (their formats as bench_gpu.py and profile_gpu.py
    write them; test_gpu_check_dry_run runs them all)."""
    out, work = tmp_path / "out", tmp_path / "work"
    (work / "multi30k").mkdir(parents=True)
    out.mkdir()
    results = [
        {"step": "tests", "seconds": 75, "rc": 0},
        {
            "what": "train transformer_base",
            "target_tok_s": 270198,
            "ms_per_update": 75.6,
            "mfu": 0.102,
            "peak_gib": 8.1,
        },
        {"what": "generate transformer_base beam 4", "sentences": 3000, "seconds": 3.35, "tokens_s": 26347},
        {"step": "bench", "seconds": 62, "rc": 0},
        {"what": "profile transformer_base", "wall_ms_per_update": 87.3, "gpu_busy": 0.58},
        {"step": "profile", "seconds": 20, "rc": 0},
        {"what": "profile generate transformer_base beam 4, budget, graphs", **GRAPHS_STEP},
        {"step": "profile-generation", "seconds": 24, "rc": 0},
        {"step": "recipe", "seconds": 170, "rc": 0},
        {"step": "compile", "seconds": 90, "rc": 124},
    ]
    results[4].update(kernels_ms=[[9.1, "nvjet_sm90_tst_128x128"]], host_ops_ms=[[4.1, "aten::mm", 141]])
    (out / "results.jsonl").write_text("".join(json.dumps({**r, "precision": "bf16"}) + "\n" for r in results))
    (out / "env.log").write_text("NVIDIA H100\ntorch 2.11.0+cu130 cuda 13.0 NVIDIA H100 80GB HBM3\n")
    (out / "tests.log").write_text("....F....\n1 failed, 8 passed in 75.2s\n")
    serve = {  # bench_serve.py's printed table: a line per figure
        "serve sent/s": "145.3",
        "generate sent/s": "588.0",
        "ratio": "0.25",
        "ratio to batch of 32": "0.77",
        "p50 ms": "194.0",
        "p99 ms": "821.0",
        "generate batch of 32 ms": "165.5",
        "1 client ms": "103.1",
        "generate 1 sentence ms": "76.9",
        "1 client added ms": "2.0",
        "conditions": "not given",
    }
    slots = serve | {"serve sent/s": "301.0", "search": "fixed slots, CUDA graphs"}
    (out / "serve.log").write_text(  # the step's header line above each run's table, as gpu_check.sh writes them
        "".join(
            f"== {step}: bench_serve.py ...\n" + "".join(f"{k:>28}  {v:>12}\n" for k, v in figures.items())
            for step, figures in (("serve", serve), ("serve-slots", slots))
        )
    )
    (work / "multi30k" / "score.txt").write_text("BLEU = 35.05 67.9/43.2/30.1/21.1 (BP = 0.949)\n")
    (work / "multi30k" / "train.jsonl").write_text('{"event": "train", "update": 1594}\n')
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check_table.py"), str(out), str(work), "417"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    table = r.stdout
    assert "| device | torch 2.11.0+cu130 cuda 13.0 NVIDIA H100 80GB HBM3 |" in table
    assert "| GPU tests | 1 failed, 8 passed in 75.2s (75 s) |" in table
    assert "270,198 target tok/s, 75.6 ms/update, MFU 10.2%, 8.1 GiB" in table
    assert "3,000 sentences in 3.35 s (26,347 tokens/s)" in table
    assert (
        "| serve (default search) | 32 clients 145.3 sent/s (0.25x generate's 588.0, 0.77x its batches of 32), "
        "p50 / p99 194.0 / 821.0 ms (2 x generate's batch of 32: 331 ms); 1 client 103.1 ms (generate 76.9 ms, "
        "serving's own 2.0 ms) |" in table
    )
    assert "| serve (fixed slots, CUDA graphs search) | 32 clients 301.0 sent/s" in table
    assert (
        "| profile generate transformer_base beam 4, budget, graphs | 4.82 ms/step (5.1 profiled), GPU busy 41% "
        "(2.09 ms/step of kernels); per step 2.0 kernel launches, 1.0 graph launches, 402.0 kernels run; costliest "
        "kernel nvjet_sm90_tst_64x8; top host op cudaGraphLaunch 0.35 ms/step |" in table
    )
    assert "| profile time | training 20 s; with CUDA graphs not run; generation 24 s |" in table
    assert "GPU busy 58%" in table and "sacreBLEU 35.05 on test_2016_flickr after 1594 updates (170 s)" in table
    assert "| compile step | failed: exit 124 after 90 s |" in table and "| gpu_check.sh in all | 417 s |" in table


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    """DRY_RUN=1: every step of gpu_check.sh on the CPU at tiny sizes (the recipe only prints its commands),
    then the table. About 30 s of CPU, up to 2 minutes of wall clock on 2 busy cores."""
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "out")],
        env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(list((tmp_path / "out").iterdir())) <= 8  # what the device tool brings back from $OUT
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| GPU tests | " in summary and " skipped" in summary  # collected, and skipped without CUDA
    assert "| train transformer_tiny (fp32) |" in summary and "| generate transformer_tiny beam 4 (fp32) |" in summary
    assert "| profile transformer_tiny |" in summary and "| profile transformer_tiny --bucket-shapes |" in summary
    assert "| profile generate transformer_tiny beam 4, batch 32, slots | " in summary
    assert "+ nmt train" in (tmp_path / "out" / "recipe.log").read_text()
    assert "| compile step | skipped: dry run" in summary
