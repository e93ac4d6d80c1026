import numpy as np
import pytest
import torch

from nmt_cli.data.batching import (
    batch_by_shapes,
    batch_by_tokens,
    bucket_count,
    bucket_length,
    collate,
    compare_padding,
    epoch_batches,
    padding_stats,
)
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
    a = epoch_batches(src, tgt, max_tokens=300, seed=7, epoch=1)
    b = epoch_batches(src, tgt, max_tokens=300, seed=7, epoch=1)
    c = epoch_batches(src, tgt, max_tokens=300, seed=7, epoch=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))


def test_resume_from_batch_index_continues_the_same_sequence():
    src, tgt = lengths(1)
    full = epoch_batches(src, tgt, max_tokens=300, seed=3, epoch=4)
    resumed = epoch_batches(src, tgt, max_tokens=300, seed=3, epoch=4)[5:]
    assert all(np.array_equal(x, y) for x, y in zip(full[5:], resumed))


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_are_disjoint_and_equal_in_size(world_size):
    src, tgt = lengths(2)
    shards = [
        epoch_batches(src, tgt, max_tokens=300, seed=1, epoch=1, rank=rank, world_size=world_size)
        for rank in range(world_size)
    ]
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


def test_length_grid_is_multiples_of_4_four_per_doubling():
    sizes = sorted({bucket_length(n) for n in range(1, 513)})
    assert sizes[:11] == [4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56] and sizes[-1] == 512
    assert all(s % 4 == 0 for s in sizes) and all(s % 8 == 0 for s in sizes if s > 32)
    for low in (16, 32, 64, 128, 256):
        assert len([s for s in sizes if low < s <= 2 * low]) == 4
    assert all(n <= bucket_length(n) <= 1.25 * n for n in range(16, 513))
    assert bucket_length(99, limit=100) == 100 and bucket_length(101, limit=100) == 112  # capped where it fits


def test_count_grid_rounds_down_to_four_per_doubling():
    counts = sorted({bucket_count(n) for n in range(1, 300)})
    assert counts[:12] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
    assert all(bucket_count(n) <= n < 1.25 * bucket_count(n) + 1 for n in range(1, 300))
    assert len([c for c in counts if 64 < c <= 128]) == 4


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("max_tokens,max_positions", [(64, 0), (300, 0), (1000, 0), (1000, 40)])
def test_bucketed_batches_hold_every_pair_once_in_few_shapes(seed, max_tokens, max_positions):
    src = np.random.default_rng(seed).integers(0, 60, 2000)
    tgt = (
        (src * 1.1 + np.random.default_rng(seed + 10).integers(-3, 4, 2000)).clip(0).astype(np.int64)
    )  # as in a corpus
    rng = np.random.default_rng(seed)
    batches, skipped = batch_by_shapes(src, tgt, max_tokens, rng, max_positions=max_positions)
    _, skipped_unbucketed = batch_by_tokens(src, tgt, max_tokens, None, max_positions=max_positions)
    used = np.concatenate(batches)
    assert skipped == skipped_unbucketed and len(used) == len(set(used.tolist())) == len(src) - skipped
    limit = min(max_tokens, max_positions) if max_positions else max_tokens
    stats = padding_stats(batches, src, tgt, limit)
    for n, s, t in stats.shapes:
        assert n == bucket_count(n) and n * s <= max_tokens and n * t <= max_tokens
        assert s in (bucket_length(s), limit) and t in (bucket_length(t), limit) and max(s, t) <= limit
    for b in batches:  # each side padded to its longest sentence's bucket
        assert (len(b), bucket_length(src[b].max() + 1, limit), bucket_length(tgt[b].max() + 1, limit)) in stats.shapes
    unbucketed = padding_stats(batch_by_tokens(src, tgt, max_tokens, rng)[0], src, tgt)
    assert len(stats.shapes) < len(unbucketed.shapes) / 2, (len(stats.shapes), len(unbucketed.shapes))


def test_padding_is_counted_by_hand():
    src, tgt = np.array([3, 9, 4]), np.array([5, 5, 20])
    batches = [np.array([0, 1]), np.array([2])]
    stats = padding_stats(batches, src, tgt, bucket_limit=100)
    # real: (4 + 10 + 5) + (6 + 6 + 21); batch 1 pads source 10 -> 12 and target 6 -> 8; batch 2 to 8 and 24
    assert stats.real == 52 and stats.trained == 2 * (12 + 8) + (8 + 24)
    assert stats.shapes == {(2, 12, 8), (1, 8, 24)}
    assert stats.padding() == pytest.approx(1 - 52 / 72)
    plain = padding_stats(batches, src, tgt)
    assert plain.trained == 2 * (10 + 6) + (5 + 21) and plain.shapes == {(2, 10, 6), (1, 5, 21)}
    assert compare_padding(batches, batches, src, tgt, 100) == (
        "2 batches in 2 shapes, 27.8% of their source and target positions padding; unbucketed 2 batches in 2 "
        "shapes, 10.3% padding: bucketing trains 24.1% more positions"
    )


def test_bucketed_epochs_are_deterministic_resumable_and_sharded():
    src, tgt = lengths(3)
    a = epoch_batches(src, tgt, max_tokens=300, seed=7, epoch=1, bucket_shapes=True)
    b = epoch_batches(src, tgt, max_tokens=300, seed=7, epoch=1, bucket_shapes=True)
    c = epoch_batches(src, tgt, max_tokens=300, seed=7, epoch=2, bucket_shapes=True)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))
    plain = epoch_batches(src, tgt, max_tokens=300, seed=7, epoch=1)
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, plain))
    shards = [
        epoch_batches(src, tgt, max_tokens=300, seed=7, epoch=1, rank=rank, world_size=2, bucket_shapes=True)
        for rank in range(2)
    ]
    assert len(shards[0]) == len(shards[1]) == len(batch_by_shapes(src, tgt, 300, None)[0]) // 2


def test_collate_pads_to_the_buckets_and_nothing_else_changes(toy_data_bin):
    data = ParallelDataset(toy_data_bin, "train")
    ids = np.arange(5)
    plain, bucketed = collate(data, ids), collate(data, ids, bucket_limit=200)
    s, t = plain.src_tokens.shape[1], plain.tgt_in.shape[1]
    assert bucketed.src_tokens.shape == (5, bucket_length(s)) and bucketed.tgt_out.shape == (5, bucket_length(t))
    assert bucketed.src_tokens.shape != plain.src_tokens.shape
    assert torch.equal(bucketed.src_tokens[:, :s], plain.src_tokens) and bucketed.src_tokens[:, s:].eq(PAD).all()
    assert torch.equal(bucketed.src_pad_mask, bucketed.src_tokens.eq(PAD))
    for name in ("tgt_in", "tgt_out"):
        assert torch.equal(getattr(bucketed, name)[:, :t], getattr(plain, name))
        assert getattr(bucketed, name)[:, t:].eq(PAD).all()
    assert bucketed.n_tgt_tokens == plain.n_tgt_tokens
