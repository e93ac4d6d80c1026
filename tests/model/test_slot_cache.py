"""The decoder step over fixed slots (Transformer.decode_slots, model/slots.py) against `decode_step`: the same
log-probs step by step with beams reordered, over the written positions or over all of them with the rest masked
(then in buffers that keep their addresses)."""

import pytest
import torch

from nmt_cli.data.vocab import BOS

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


@pytest.mark.parametrize("window", [True, False], ids=["written", "masked"])
@torch.inference_mode()
def test_slots_step_as_decode_step_does(tiny_model, window):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 24, (3, 7), generator=g)
    src[1, 4:] = 0  # padding
    enc = tiny_model.encode(src, src.eq(0))
    beam, n = 2, 6
    cache = tiny_model.init_cache(enc, beam)
    slots = tiny_model.init_slots(enc, beam, n_positions=10, source_len=7 if window else 64)
    addresses = [t.data_ptr() for t in (*slots.self_k, *slots.self_v, *slots.cross_k, slots.step)]
    prev, rows = torch.full((n,), BOS), None
    for step in range(6):
        want, cache = tiny_model.decode_step(prev, cache)
        got = tiny_model.decode_slots(prev, rows, slots, step + 1 if window else None)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        rows = torch.randint(0, n, (n,), generator=g)  # any reorder, repeats included
        cache = cache.select_rows(rows)
        prev = torch.randint(4, 24, (n,), generator=g)
    assert int(slots.step) == 6
    if not window:  # a step to capture keeps every address (eager steps swap buffers with their spares)
        assert [t.data_ptr() for t in (*slots.self_k, *slots.self_v, *slots.cross_k, slots.step)] == addresses


@torch.inference_mode()
def test_a_loaded_batch_starts_again(tiny_model):
    """load() takes another batch of the same shapes into the buffers: its steps are those of a fresh cache."""
    g = torch.Generator().manual_seed(1)
    first, second = (tiny_model.encode(torch.randint(4, 24, (2, 5), generator=g), None) for _ in range(2))
    reused = tiny_model.init_slots(first, 2, n_positions=8, source_len=5)
    prev = torch.full((4,), BOS)
    tiny_model.decode_slots(prev, None, reused, None)
    fresh = tiny_model.init_slots(second, 2, n_positions=8, source_len=5)
    reused.load(fresh)
    for _ in range(3):
        torch.testing.assert_close(
            tiny_model.decode_slots(prev, None, reused, None), tiny_model.decode_slots(prev, None, fresh, None)
        )
        prev = torch.randint(4, 24, (4,), generator=g)
    with pytest.raises(AssertionError):
        reused.load(tiny_model.init_slots(second, 2, n_positions=8, source_len=6))
