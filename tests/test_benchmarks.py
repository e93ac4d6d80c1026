"""The benchmark scripts that have a tiny mode run in the fast suite, so that none can rot unseen: each runs as a
user runs it (a child process), at sizes that take seconds, and must print its table."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT


def run_benchmark(script: str, *args: str, tmp_path) -> str:
    env = os.environ | {"NMT_BENCH_RESULTS": str(tmp_path / "results"), "NMT_BENCH_DIR": str(tmp_path / "work")}
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
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
