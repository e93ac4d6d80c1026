"""The epoch plan off the critical path: a run buckets its pairs into batches once; each epoch only draws and
shuffles them, deterministically per (seed, epoch), as `epoch_batches` (the peer harness's count) does."""

import numpy as np
import pytest
from conftest import ONE_ROUTE, tiny_train_config

from nmt_cli.data.batching import epoch_batches
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.runtime import DistInfo
from nmt_cli.train import epoch_plan

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


@ONE_ROUTE  # the subject is the host's batching, which no matmul touches
def test_later_epochs_reuse_the_runs_batches_in_a_new_order(toy_data_bin, tmp_path, monkeypatch):
    made = []
    length_batches = epoch_plan.length_batches
    monkeypatch.setattr(epoch_plan, "length_batches", lambda *a, **k: made.append(1) or length_batches(*a, **k))
    data = ParallelDataset(toy_data_bin, "train")
    cfg = tiny_train_config(toy_data_bin, tmp_path, max_tokens=128, seed=5)
    plans = [epoch_plan.plan_epoch(data, cfg, max_positions=64, info=DistInfo(), epoch=e) for e in (1, 2, 1)]
    assert len(made) == 1  # bucketed once, for the first epoch
    first, second, again = (p.batches for p in plans)
    assert sorted(map(tuple, first)) == sorted(map(tuple, second))  # the same batches ...
    assert [tuple(b) for b in first] != [tuple(b) for b in second]  # ... in another order
    assert [tuple(b) for b in first] == [tuple(b) for b in again]
    # what the peer harness counts is what trains
    batches = epoch_batches(data.src_lens, data.tgt_lens, 128, 5, 2, max_positions=64)
    assert [tuple(b) for b in batches] == [tuple(b) for b in second]


@ONE_ROUTE  # the subject is the host's batching, which no matmul touches
def test_ranks_share_an_epochs_batches_without_overlap(toy_data_bin, tmp_path):
    data = ParallelDataset(toy_data_bin, "train")
    cfg = tiny_train_config(toy_data_bin, tmp_path, max_tokens=128)
    shards = [
        epoch_plan.plan_epoch(data, cfg, max_positions=64, info=DistInfo(rank, 2), epoch=3).batches for rank in (0, 1)
    ]
    assert len(shards[0]) == len(shards[1])
    ids = np.concatenate([np.concatenate(s) for s in shards])
    assert len(ids) == len(set(ids.tolist()))
