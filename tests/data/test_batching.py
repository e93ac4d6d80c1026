import numpy as np
import pytest

from nmt_cli.data.batching import batch_by_tokens, collate, epoch_batches
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.data.vocab import BOS, EOS, PAD


def lengths(seed, n=500):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 60, n), rng.integers(0, 60, n)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_tokens", [64, 200, 1000])
def test_every_index_once_and_budget_respected(seed, max_tokens):
    src, tgt = lengths(seed)
    batches, skipped = batch_by_tokens(src, tgt, max_tokens, np.random.default_rng(seed))
    used = np.concatenate(batches)
    assert skipped == 0 and sorted(used.tolist()) == list(range(len(src)))
    for b in batches:
        assert len(b) * (src[b].max() + 1) <= max_tokens
        assert len(b) * (tgt[b].max() + 1) <= max_tokens


def test_over_long_pairs_are_skipped_and_counted():
    src, tgt = np.array([3, 100, 4, 5]), np.array([3, 4, 100, 5])
    batches, skipped = batch_by_tokens(src, tgt, 50, None)
    assert skipped == 2
    assert sorted(np.concatenate(batches).tolist()) == [0, 3]


def test_epochs_are_deterministic_and_reshuffled():
    src, tgt = lengths(0)
    a = epoch_batches(src, tgt, 300, seed=7, epoch=1)
    b = epoch_batches(src, tgt, 300, seed=7, epoch=1)
    c = epoch_batches(src, tgt, 300, seed=7, epoch=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))


def test_resume_from_batch_index_continues_the_same_sequence():
    src, tgt = lengths(1)
    full = epoch_batches(src, tgt, 300, seed=3, epoch=4)
    resumed = epoch_batches(src, tgt, 300, seed=3, epoch=4)[5:]
    assert all(np.array_equal(x, y) for x, y in zip(full[5:], resumed))


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_are_disjoint_and_equal_in_size(world_size):
    src, tgt = lengths(2)
    shards = [epoch_batches(src, tgt, 300, 1, 1, rank, world_size) for rank in range(world_size)]
    assert len({len(s) for s in shards}) == 1
    seen = np.concatenate([np.concatenate(s) for s in shards])
    assert len(seen) == len(set(seen.tolist()))
    all_batches, _ = batch_by_tokens(src, tgt, 300, np.random.default_rng([1, 1]))
    assert len(shards[0]) == len(all_batches) // world_size


def test_collate_layout(toy_data_bin):
    data = ParallelDataset(toy_data_bin, "valid")
    ids = np.array([0, 1, 2])
    batch = collate(data, ids)
    for row, i in enumerate(ids):
        s, t = data.src[i].tolist(), data.tgt[i].tolist()
        assert batch.src_tokens[row, : len(s) + 1].tolist() == s + [EOS]
        assert batch.tgt_in[row, : len(t) + 1].tolist() == [BOS] + t
        assert batch.tgt_out[row, : len(t) + 1].tolist() == t + [EOS]
        assert batch.src_pad_mask[row].tolist() == [False] * (len(s) + 1) + [True] * (
            batch.src_tokens.shape[1] - len(s) - 1
        )
    assert batch.n_tgt_tokens == int(batch.tgt_out.ne(PAD).sum())
