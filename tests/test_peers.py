"""The peer harness's contract with nmt (`make bench-peers` runs ../shared/peer-bench): its token counter rebuilds
nmt's batches with nmt's own code. The harness is not part of this repository; these tests skip where it is absent.
A change of nmt's API broke its training rows once (epoch_batches' arguments became keyword-only), unseen until a
session ran the benchmark."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from nmt_cli.data.batching import epoch_batches
from nmt_cli.data.dataset import ParallelDataset

HARNESS = ROOT.parent / "shared" / "peer-bench"
needs_harness = pytest.mark.skipif(not (HARNESS / "bench.sh").exists(), reason=f"no peer harness at {HARNESS}")


@needs_harness
def test_the_token_counter_appends_each_updates_target_tokens(toy_data_bin):
    """lib/nmt_tokens.py DATA_BIN MAX_TOKENS SEED EPOCH: update N's line gains the target tokens (EOS included)
    of epoch EPOCH's batch N, as nmt train batches it."""
    train = ParallelDataset(toy_data_bin, "train")
    batches = epoch_batches(train.src_lens, train.tgt_lens, max_tokens=64, seed=1, epoch=1)
    lines = [f"12:00:0{n} | train | update {n} | loss 3.1\n" for n in (1, 2, 3)] + ["valid | update 3\n"]
    done = subprocess.run(
        [sys.executable, str(HARNESS / "lib" / "nmt_tokens.py"), str(toy_data_bin), "64", "1", "1"],
        input="".join(lines),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    counted = done.stdout.splitlines()
    assert len(counted) == 4 and counted[3] == "valid | update 3"
    for n, line in enumerate(counted[:3]):
        assert line == lines[n].rstrip("\n") + f" NMTTOK={int(np.sum(train.tgt_lens[batches[n]] + 1))}"
