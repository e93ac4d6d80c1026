"""benchmarks/profile_serve.py runs end to end at tiny sizes (it is what gpu_check.sh's serve step runs after
bench_serve.py): it prints its figures for every variant."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_profile_serve_prints_every_variant(trained_copy_checkpoint, tmp_path):
    lines = ["1 2 3", "4 5 6 7 8 9", "0", "9 9 8", "3 1 4 1 5 9 2 6", "7 7", "5 0 5 0 5", "2 4 6 8"] * 3
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    env = os.environ | {"PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_serve.py"), "--path", str(trained_copy_checkpoint)]
        + ["--input", str(src), "--single", "3", "--rounds", "1"]
        + ["--threads", "1", "--clients", "4", "--sentences", "12"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for variant in ("thread", "batcher"):
        assert re.search(rf"^\s+{variant}\s+[\d.]+\s+median\s+[\d.]+$", out, re.M), out
    assert "3 sentences, 1 rounds alternated" in out, out
    for row in ("sorted 4", "arrival 4", "batcher", "mean batch", "searching %", "steps/batch", "ms/step"):
        assert re.search(rf"^\s+{row}\s+[\d.]+\s+median\s+[\d.]+$", out, re.M), out
    assert "4 clients (12 sentences, 1 rounds alternated)" in out, out


def test_profile_serve_event_loop_prints_its_cpu_per_request(trained_copy_checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(["1 2 3", "4 5 6 7 8 9", "0", "9 9 8"] * 16) + "\n")
    env = os.environ | {"PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_serve.py"), "--path", str(trained_copy_checkpoint)]
        + ["--input", str(src), "--event-loop", "--sentences", "64", "--rounds", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(
        r"^event loop, 64 requests 32 at a time, CPU ms per request:\n\s+[\d.]+\s+median", result.stdout, re.M
    )
    assert "nmt_cli/serve/app.py" in result.stdout, result.stdout  # the profile's rows
