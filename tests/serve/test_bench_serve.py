"""benchmarks/bench_serve.py's tiny mode runs end to end: generate's baselines, the server under 4 clients
and 1, and a report whose translations match generate's."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # three generate runs and two servers, each a child process: about 15 s on 2 free cores
def test_tiny_mode_reports_throughput_and_latency_next_to_generate(trained_copy_checkpoint, tmp_path):
    env = {**os.environ, "NMT_BENCH_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"), "--tiny", "--threads", "1"]
        + ["--path", str(trained_copy_checkpoint)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [re.match(r"\s*(.+?)\s{2,}(.*)$", line) for line in result.stdout.splitlines()]
    report = {m.group(1): m.group(2).split() for m in rows if m}
    assert report["batching"] == ["whole", "in-flight"]  # one server each, side by side
    assert report["sentences"] == ["24", "24"] and report["differ from generate"] == ["0", "0"]
    for served, generated in zip(report["serve sent/s"], report["generate sent/s"]):
        assert float(served) > 0 and float(generated) > 0
    for p50, p99 in zip(report["p50 ms"], report["p99 ms"]):
        assert float(p99) >= float(p50) > 0
    for added, http_cpu in zip(report["1 client added ms"], report["HTTP CPU ms/request"]):
        assert 0 <= float(added) < 1000 and float(http_cpu) > 0  # latency less search; the event loop's CPU
