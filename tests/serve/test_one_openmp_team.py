"""`nmt serve` runs PyTorch on its worker thread alone: the main thread (loading, the event loop's checks and
encoding) never runs a parallel op. PyTorch's CPU ops run on the calling thread's OpenMP team, which lives as long
as that thread; with a second team alive (more OpenMP threads than cores), GNU OpenMP's teams wait by sleeping
instead of spinning, and every parallel op of the worker ran about 3x slower (2 Zen 3 cores, --threads 2: 94
against 320 us a small product; benchmarks/profile_serve.py measured that, before it ran its searches alone).

Checked by the process's OS threads, in a fresh interpreter (pytest's own may hold a team already): the main
thread's work adds none, the worker adds itself and its team's threads, and once it ends none are left."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys, time
import torch
from nmt_cli.config import ServeConfig
from nmt_cli.runtime import set_threads
from nmt_cli.serve.models import Models, key_of
from nmt_cli.serve.served_model import ServedModel

def threads():
    return len(os.listdir("/proc/self/task"))

set_threads(2)
before = threads()
served = ServedModel(ServeConfig(path=sys.argv[1], device="cpu"), {"beam": 2})
models = Models.one(served)
batcher = models.batcher(0.0, 100)
key = key_of(models.default, served.search)
loaded = threads()
batcher.start()
batcher.ready.wait()
for text in ["1 2 3", "4 5 6 7", "8 9"]:  # as the event loop prepares a request, then waits for its answer
    sentences = served.reader.prepare([text])
    batcher.submit(key, sentences, [served.reader.length(s) for s in sentences]).result()
serving = threads()
batcher.stop()
for _ in range(100):  # the team's threads leave once told by the ended worker's exit, not before it returns
    if threads() == before:
        break
    time.sleep(0.02)
print(before, loaded, serving, threads())
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_the_main_thread_runs_no_openmp_team(tiny_checkpoint):
    env = os.environ | {"PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "2"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_checkpoint)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before, loaded, serving, after = map(int, result.stdout.split())
    assert loaded == before, "loading the model on the main thread started threads (an OpenMP team?)"
    assert serving == before + 2, "the worker and its team's one more thread (--threads 2), and no other"
    assert after == before, "threads left once the worker ended: the main thread's own team"
