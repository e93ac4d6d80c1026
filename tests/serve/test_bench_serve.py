"""benchmarks/bench_serve.py's tiny mode runs end to end: generate's baselines, the server under 4 clients
and 1, and a report whose translations match generate's (with --fixed-slots, both over fixed slots); with
--adversary, the 4 clients without and with a client of the most expensive requests the caps allow; with
--threads-compare, a server per thread count."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
ROOT = Path(__file__).resolve().parents[2]


def bench_serve(checkpoint, tmp_path, *options: str) -> dict[str, str]:
    """Run bench_serve.py --tiny; its report, figure by figure."""
    env = {**os.environ, "NMT_BENCH_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"), "--tiny", "--threads", "1"]
        + ["--path", str(checkpoint), *options],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [re.match(r"\s*(.+?)\s{2,}(.*)$", line) for line in result.stdout.splitlines()]
    return {m.group(1): m.group(2).strip() for m in rows if m}


@pytest.mark.slow  # three generate runs and a server, each a child process: about 10 s on 2 free cores
def test_tiny_mode_reports_throughput_and_latency_next_to_generate(trained_copy_checkpoint, tmp_path):
    report = bench_serve(trained_copy_checkpoint, tmp_path)
    assert report["sentences"] == "24" and report["differ from generate"] == "0"
    assert float(report["serve sent/s"]) > 0 and float(report["generate sent/s"]) > 0
    assert float(report["p99 ms"]) >= float(report["p50 ms"]) > 0
    added, http_cpu = float(report["1 client added ms"]), float(report["HTTP CPU ms/request"])
    assert 0 <= added < 1000 and http_cpu > 0  # latency less search; the event loop's CPU
    assert report["server caps"] == "its defaults" and '"cores"' in report["machine"]
    assert report["search"] == "default"


@pytest.mark.slow  # as above, then two more load phases and two more servers
def test_tiny_mode_with_an_adversary_and_two_thread_counts(trained_copy_checkpoint, tmp_path):
    """Over fixed slots (--fixed-slots): the adversary's plain beam searches run there, stopped by its timeout."""
    small = ["--max-input-chars", "2000", "--max-request-sentences", "16", "--timeout", "2"]  # the guide's beam, output
    report = bench_serve(
        trained_copy_checkpoint, tmp_path, "--adversary", *small, "--threads-compare", "1,0", "--fixed-slots"
    )
    assert report["search"] == "fixed slots, eager" and report["differ from generate"] == "0"
    caps = "--max-beam 8 --max-output-tokens 256 --max-input-chars 2000 --max-request-sentences 16 --timeout 2.0"
    assert report["server caps"] == caps
    # transformer_tiny's 256 positions bound the forced length below --max-output-tokens
    assert report["adversary request"] == "16 texts of 2000 chars, beam 8, nbest 8, min_len = max_len_b 255"
    answers = dict(reversed(part.split(" x ")) for part in report["adversary answers"].split(", "))
    assert set(answers) <= {"200", "504"} and sum(map(int, answers.values())) >= 1
    for condition in ("without adversary", "with adversary"):
        assert float(report[f"{condition} p99 ms"]) >= float(report[f"{condition} p50 ms"]) > 0
        assert float(report[f"{condition} sent/s"]) > 0
    # a normal request may time out behind the adversary's batch (a figure, not a failure), not be refused
    assert report["without adversary not 200"] == "none"
    assert re.fullmatch(r"none|\d+ x 504", report["with adversary not 200"])
    ratio = float(report["with adversary p99 ms"]) / float(report["without adversary p99 ms"])
    assert float(report["p99 with / without"]) == pytest.approx(ratio, abs=0.01)
    rate = float(report["with adversary sent/s"]) / float(report["without adversary sent/s"])
    assert float(report["sent/s with / without"]) == pytest.approx(rate, abs=0.01)
    assert report["adversary phases differ"] == "0"
    for threads in ("1", "0"):
        assert float(report[f"threads {threads} sent/s"]) > 0
        assert float(report[f"threads {threads} p99 ms"]) >= float(report[f"threads {threads} p50 ms"]) > 0
