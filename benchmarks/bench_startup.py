"""Start-up: wall seconds of `nmt --help`, `nmt train --help`, `nmt serve --help` and of a usage error, the median
of --runs child processes each (none imports torch: issue 47's target is under 0.5 s), beside `import torch` alone."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from common import NMT, report

COMMANDS = {
    "nmt --help": NMT + ["--help"],
    "nmt train --help": NMT + ["train", "--help"],
    "nmt serve --help": NMT + ["serve", "--help"],
    "nmt train --no-such-option": NMT + ["train", "--no-such-option"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
}


def seconds_of(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=11, help="child processes per command (the median is shown)")
    runs = parser.parse_args().runs
    rows = []
    for label, args in COMMANDS.items():
        seconds_of(args)  # warm the file cache
        times = [seconds_of(args) for _ in range(runs)]
        rows.append({"command": label, "median_s": statistics.median(times), "min_s": min(times), "runs": runs})
        print(rows[-1], flush=True)
    report("startup", rows)


if __name__ == "__main__":
    main()
