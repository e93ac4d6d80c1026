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


@pytest.mark.slow  # three generate runs and a server, each a child process: about 10 s on 2 free cores
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
    report = {m.group(1): m.group(2).strip() for m in rows if m}
    assert report["sentences"] == "24" and report["differ from generate"] == "0"
    assert float(report["serve sent/s"]) > 0 and float(report["generate sent/s"]) > 0
    assert float(report["p99 ms"]) >= float(report["p50 ms"]) > 0
    added, http_cpu = float(report["1 client added ms"]), float(report["HTTP CPU ms/request"])
    assert 0 <= added < 1000 and http_cpu > 0  # latency less search; the event loop's CPU
