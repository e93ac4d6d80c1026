"""The decoder step over fixed slots (Transformer.decode_slots, model/slots.py) against `decode_step`: the same
log-probs step by step with beams reordered, over all positions with those not yet written masked, in buffers that
keep their addresses; a batch moved to fewer slots and loaded into another cache of their shapes steps on as it
would have."""

import pytest
import torch

from nmt_cli.data.vocab import BOS

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


@torch.inference_mode()
def test_slots_step_as_decode_step_does(tiny_model):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 24, (3, 7), generator=g)
    src[1, 4:] = 0  # padding
    enc = tiny_model.encode(src, src.eq(0))
    beam, n = 2, 6
    cache = tiny_model.init_cache(enc, beam)
    slots = tiny_model.init_slots(enc, beam, n_positions=10, source_len=64)
    addresses = [t.data_ptr() for t in (*slots.self_k, *slots.self_v, *slots.cross_k, slots.step)]
    prev, rows = torch.full((n,), BOS), None
    for step in range(6):
        want, cache = tiny_model.decode_step(prev, cache)
        got = tiny_model.decode_slots(prev, rows, slots)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        rows = torch.randint(0, n, (n,), generator=g)  # any reorder, repeats included
        cache = cache.select_rows(rows)
        prev = torch.randint(4, 24, (n,), generator=g)
    assert slots.step.tolist() == [6] * n
    assert [t.data_ptr() for t in (*slots.self_k, *slots.self_v, *slots.cross_k, slots.step)] == addresses


@torch.inference_mode()
def test_a_loaded_batch_starts_again(tiny_model):
    """load() takes another batch of the same shapes into the buffers: its steps are those of a fresh cache."""
    g = torch.Generator().manual_seed(1)
    first, second = (tiny_model.encode(torch.randint(4, 24, (2, 5), generator=g), None) for _ in range(2))
    reused = tiny_model.init_slots(first, 2, n_positions=8, source_len=5)
    prev = torch.full((4,), BOS)
    tiny_model.decode_slots(prev, None, reused)
    fresh = tiny_model.init_slots(second, 2, n_positions=8, source_len=5)
    reused.load(fresh, 0)
    for _ in range(3):
        torch.testing.assert_close(
            tiny_model.decode_slots(prev, None, reused), tiny_model.decode_slots(prev, None, fresh)
        )
        prev = torch.randint(4, 24, (4,), generator=g)
    with pytest.raises(AssertionError):
        reused.load(tiny_model.init_slots(second, 2, n_positions=8, source_len=6), 0)


@torch.inference_mode()
def test_fewer_slots_step_on_as_the_kept_rows_would(tiny_model):
    """select() keeps some sentences with a reorder of their rows; loaded, at its step, into another cache of the
    smaller shapes (a bucket's, which held another batch), their next steps are those of the same rows in the whole
    cache."""
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, 24, (3, 6), generator=g)
    src[0, 3:] = 0  # padding
    enc = tiny_model.encode(src, src.eq(0))
    beam, n, written = 2, 6, 4
    whole = tiny_model.init_slots(enc, beam, n_positions=9, source_len=64)
    for step in range(written):
        rows = None if step == 0 else torch.randint(0, n, (n,), generator=g)
        tiny_model.decode_slots(torch.randint(4, 24, (n,), generator=g), rows, whole)
    keep, rows = torch.tensor([2, 0]), torch.tensor([5, 4, 0, 0])  # sentence 2's rows, then sentence 0's
    fewer = tiny_model.init_slots(enc.select(torch.tensor([1, 1])), beam, n_positions=9, source_len=64)
    for _ in range(6):  # another batch's steps, past the moved batch's
        tiny_model.decode_slots(torch.randint(4, 24, (4,), generator=g), None, fewer)
    fewer.load(whole.select(keep, rows), written)
    full_rows = torch.tensor([0, 0, 2, 3, 5, 4])  # the same reorder in the whole cache: its rows 4, 5 and 0, 1
    for _ in range(written, 7):
        prev = torch.randint(4, 24, (n,), generator=g)
        want = tiny_model.decode_slots(prev, full_rows, whole)
        got = tiny_model.decode_slots(prev[[4, 5, 0, 1]], None, fewer)
        torch.testing.assert_close(got, want[[4, 5, 0, 1]], atol=1e-5, rtol=1e-5)
        full_rows = None
    assert fewer.step.tolist() == [7] * 4
    fewer.park(torch.tensor([False, False, True, True]))  # a finished sentence's rows go back to position 0
    assert fewer.step.tolist() == [7, 7, 0, 0]
