"""The GPU benchmark and check scripts run, on the CPU at tiny sizes, so that they cannot rot unseen between
the rare sessions that have a GPU (issue 33: bench_gpu.py crashed there before its first figure)."""

import json
import subprocess
import sys

from conftest import ROOT


def test_bench_gpu_runs_on_cpu(tmp_path):
    results = tmp_path / "bench.jsonl"
    r = subprocess.run(
        [sys.executable, "benchmarks/bench_gpu.py", "--device", "cpu", "--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "train transformer_tiny" in r.stdout and "generate transformer_tiny beam 4" in r.stdout, r.stdout
    figures = [json.loads(line) for line in results.read_text().splitlines()]
    assert [f["what"] for f in figures] == ["train transformer_tiny", "generate transformer_tiny beam 4"]
    assert figures[0]["target_tok_s"] > 0 and figures[1]["sentences"] == 20
