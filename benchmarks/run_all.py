"""`make bench`: every benchmark in turn (about 10 minutes on 2 cores); tables on stdout, JSON in
benchmarks/results/."""

import subprocess
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
for script in ("bench_preprocess.py", "bench_matmul.py", "bench_train.py", "bench_generate.py"):
    print(f"== {script}", flush=True)
    args = ["--lengths", "forced,natural"] if script == "bench_generate.py" else []
    subprocess.run([sys.executable, str(here / script), *args], check=True, cwd=here)
