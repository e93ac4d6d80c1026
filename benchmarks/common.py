"""Shared helpers for the benchmark scripts: data, subprocess runs with their peak RSS, and tables.

Benchmarks run the real `nmt` command in child processes, so each figure includes what a user runs,
and `os.wait4` gives each child's own peak resident memory.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NMT_SHARED_DATA", ROOT.parent / "shared" / "data"))
MULTI30K = SHARED / "multi30k"
WORK = Path(os.environ.get("NMT_BENCH_DIR", ROOT / "work" / "bench"))
RESULTS = Path(os.environ.get("NMT_BENCH_RESULTS", ROOT / "benchmarks" / "results"))
NMT = [sys.executable, "-m", "nmt_cli", "--no-progress"]
# In-process beam search as the command and the peer harness run it: beam 4, batches of 64 sentences,
# every hypothesis forced to 24 tokens (SearchConfig fields, so that each toolkit does the same work).
FORCED_SEARCH = {"beam": 4, "lenpen": 0.6, "lenpen_style": "fairseq", "min_len": 24, "max_len_a": 0, "max_len_b": 24}
BATCH = 64


def run(args: list[str], stdout=subprocess.DEVNULL) -> tuple[str, float, float]:
    """Run a command; return (stderr, wall seconds, peak RSS in GB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=stdout, stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(args)}\n{stderr[-2000:]}")
    return stderr, seconds, usage.ru_maxrss / 1024 / 1024


def preprocess_args(dest: Path, *extra: str) -> list[str]:
    """`nmt preprocess` of Multi30k EN-DE (train, valid, test_2016_flickr) into `dest`, 8k pieces, 2 workers."""
    return [
        "preprocess",
        "-s",
        "en",
        "-t",
        "de",
        "--trainpref",
        str(MULTI30K / "train"),
        "--validpref",
        str(MULTI30K / "valid"),
        "--testpref",
        str(MULTI30K / "test_2016_flickr"),
        "--destdir",
        str(dest),
        "--vocab-size",
        "8000",
        "--workers",
        "2",
        *extra,
    ]


def data_bin() -> Path:
    """Multi30k EN-DE with a joint 8k vocabulary, built once."""
    dest = WORK / "multi30k-bin"
    if not (dest / "meta.json").exists():
        if not (MULTI30K / "train.en").exists():
            raise SystemExit(f"benchmarks need {MULTI30K} (set NMT_SHARED_DATA)")
        run(NMT + preprocess_args(dest, "--max-len-ratio", "3"))
    return dest


SHAPES = {"small": ["--arch", "transformer_small"], "base": ["--arch", "transformer_base"]}


def train_args(save: Path, shape: str, max_tokens: int, *extra: str) -> list[str]:
    """`nmt train` on the Multi30k data in `save`, one shape, 2 threads on the CPU."""
    return [
        "train",
        str(data_bin()),
        "--save-dir",
        str(save),
        *SHAPES[shape],
        "--max-tokens",
        str(max_tokens),
        "--threads",
        "2",
        "--device",
        "cpu",
        *extra,
    ]


def checkpoint(shape: str) -> Path:
    """A checkpoint of the given shape after one update (speed does not depend on training)."""
    save = WORK / f"ckpt-{shape}"
    if not (save / "checkpoint_last.pt").exists():
        run(NMT + train_args(save, shape, 1024, "--max-update", "1"))
    return save / "checkpoint_last.pt"


def precisions(asked: str | None) -> list[str]:
    """The training precisions to measure: those asked for, else fp32 and bf16 where this CPU runs bf16
    products (nmt_cli.runtime.cpu_has_bf16, the rule `make bench-peers` follows) and fp32 alone elsewhere:
    on an AVX2-only CPU bf16 is emulated, about 30x slower than fp32 (an AMD Zen 3 took 65 s for one
    transformer_small update), which would stretch `make bench` from minutes to hours."""
    if asked:
        return asked.split(",")
    sys.path.insert(0, str(ROOT))
    from nmt_cli.runtime import cpu_has_bf16

    if cpu_has_bf16():
        return ["fp32", "bf16"]
    print("this CPU has no bf16 instructions: bf16 left out (--precisions fp32,bf16 forces it)", file=sys.stderr)
    return ["fp32"]


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    if not match:
        raise SystemExit(f"could not find {pattern!r} in:\n{text[-2000:]}")
    return float(match.group(1).replace(",", ""))


def machine() -> dict:
    import torch

    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def report(name: str, rows: list[dict]) -> None:
    """Print a table and write benchmarks/results/<name>.json."""
    keys = list(rows[0])
    widths = [max(len(k), *(len(fmt(r[k])) for r in rows)) for k in keys]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for r in rows:
        print("  ".join(fmt(r[k]).ljust(w) for k, w in zip(keys, widths)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return str(value)
