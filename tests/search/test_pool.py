"""search/pool.py: sentences that join a running beam search and leave it get beam_search's own hypotheses,
whatever company they keep (joining early, late, into an empty pool, beside longer and shorter sources)."""

from collections import Counter

import numpy as np
import pytest
import torch
from host_syncs import SyncLog, caller

from nmt_cli.config import SearchConfig
from nmt_cli.search.pool import BeamPool
from nmt_cli.search.translate import load_translator, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

# Digit sentences like the copy corpus the fixtures' models learned (tests/conftest.py), of many lengths
LINES = ["1 2 3", "4 5 6 7 8 9", "0", "9 9 8", "3 1 4 1 5 9 2 6", "7 7", "5 0 5 0 5", "2 4 6 8", "8 1 9 0 2 2 4 4 1"]
JOINS = [3, 0, 1, 0, 0, 2, 1]  # sentences joining at steps 0, 1, 2, ... (then none until the pool is empty)


def pooled(tr, sources, cfg, joins):
    """Each source's hypotheses from one BeamPool, the sources joining `joins[step]` at a time; after `joins`
    runs out, the rest join each time the pool has emptied."""
    pool = BeamPool(tr.model, cfg, tr.vocab.n_pieces, tr.device, tr.amp_dtype)
    results, added, step = {}, 0, 0
    while len(results) < len(sources):
        n = joins[step] if step < len(joins) else (2 if not len(pool) else 0)
        n = min(n, len(sources) - added)
        pool.add(sources[added : added + n], list(range(added, added + n)))
        added += n
        for tag, hyps in pool.step():
            assert tag not in results
            results[tag] = hyps
        step += 1
    return [results[i] for i in range(len(sources))]


def check_same(got, expected):
    for mine, theirs in zip(got, expected):
        assert [h.tokens for h in mine] == [h.tokens for h in theirs]
        for a, b in zip(mine, theirs):
            assert a.score == pytest.approx(b.score, abs=1e-4)
            assert a.positional_scores == pytest.approx(b.positional_scores, abs=1e-4)


SETTINGS = [
    {"beam": 4},
    {"beam": 3, "nbest": 3, "lenpen": 1.0, "lenpen_style": "fairseq"},
    {"beam": 2, "min_len": 3, "max_len_a": 0.0, "max_len_b": 4},  # every output ends at or near its limit
    {"beam": 5, "nbest": 2, "max_len_a": 1.5, "max_len_b": 2, "lenpen": 0.0},
]


def devices():
    yield "cpu"
    yield pytest.param("cuda", marks=pytest.mark.gpu)


@pytest.mark.parametrize("device", list(devices()))
@pytest.mark.parametrize("settings", SETTINGS)
def test_joining_sentences_get_the_hypotheses_of_beam_search(trained_copy_checkpoint, settings, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    tr, _ = load_translator(trained_copy_checkpoint, torch.device(device), None)
    sources = [np.asarray(ids, dtype=np.int64) for ids in tr.vocab.encode(LINES)]
    cfg = SearchConfig(**settings)
    expected = translate(tr, sources, cfg, max_tokens=4096, batch_size=1)  # each sentence alone
    check_same(pooled(tr, sources, cfg, JOINS), expected)
    check_same(pooled(tr, sources, cfg, [len(sources)]), expected)  # all at once: generate's one batch


def test_an_untrained_model_that_runs_to_the_length_limit_keeps_company_apart(tiny_checkpoint):
    """Outputs of a barely trained model run to their maximum length (a * |x| + b): long-lived sentences
    that later joiners share every step with, and the decoder columns of those that left are dropped."""
    tr, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    sources = [np.asarray(ids, dtype=np.int64) for ids in tr.vocab.encode(LINES)]
    cfg = SearchConfig(beam=3, max_len_a=1.0, max_len_b=6)
    expected = translate(tr, sources, cfg, max_tokens=4096, batch_size=1)
    assert max(len(h[0].tokens) for h in expected) >= 8  # some do run long
    check_same(pooled(tr, sources, cfg, [1, 1, 0, 0, 1, 0, 2, 0, 0, 0, 1, 1, 1]), expected)


def test_an_empty_pool_does_nothing_and_a_source_must_fit_the_model(tiny_checkpoint):
    tr, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    pool = BeamPool(tr.model, SearchConfig(beam=2), tr.vocab.n_pieces, tr.device)
    assert len(pool) == 0 and pool.step() == []
    with pytest.raises(AssertionError):
        pool.add([np.array([], dtype=np.int64)], ["empty"])


class Copies(SyncLog):
    """SyncLog that also records the copies to a device (`.to`), which on CUDA wait for the device too unless
    made from pinned memory (search/pool.py's to_device)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        to_device = any(isinstance(a, (torch.device, str)) for a in args[1:]) or "device" in (kwargs or {})
        if self.depth == 0 and getattr(func, "__name__", "") == "to" and to_device:
            self.syncs.append(("to", caller()))
        return super().__torch_function__(func, types, args, kwargs)


def test_a_step_waits_for_the_device_once_and_copies_nothing_to_it_unless_sentences_join(tiny_checkpoint):
    """In the steady state a step reads only which sentences are done, and copies nothing to the device; a
    step where some finish also copies their hypotheses to the host (collect's four copies) and the new masks
    to the device, through to_device (pinned memory on CUDA: no wait)."""
    tr, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    sources = [np.asarray(ids, dtype=np.int64) for ids in tr.vocab.encode(LINES)]
    pool = BeamPool(tr.model, SearchConfig(beam=3, max_len_a=1.0, max_len_b=6), tr.vocab.n_pieces, tr.device)
    pool.add(sources[:5], list(range(5)))
    pool.step()  # the join (encoder, copies of the sources and lengths to the device)
    checked = 0
    while len(pool):
        with Copies() as log:
            finished = pool.step()
        where = Counter((call, at.rsplit(" in ", 1)[1]) for call, at in log.syncs)
        expected = Counter({("cpu", "_advance"): 1})
        if finished and len(pool):
            expected += Counter({("cpu", "collect"): 4, ("to", "to_device"): where[("to", "to_device")]})
            assert 1 <= where[("to", "to_device")] <= 2  # the sources' padding, and the rows' starts if any
        elif finished:
            expected += Counter({("cpu", "collect"): 4})
        assert where == expected, where
        checked += 1
    assert checked >= 6


def test_dropped_sentences_leave_without_a_result_and_the_others_are_untouched(trained_copy_checkpoint):
    tr, _ = load_translator(trained_copy_checkpoint, torch.device("cpu"), None)
    sources = [np.asarray(ids, dtype=np.int64) for ids in tr.vocab.encode(LINES)]
    cfg = SearchConfig(beam=4)
    expected = translate(tr, sources, cfg, max_tokens=4096, batch_size=1)
    pool = BeamPool(tr.model, cfg, tr.vocab.n_pieces, tr.device)
    pool.add(sources[:6], list(range(6)))
    pool.step()
    pool.drop([1, 4])
    pool.add(sources[6:], list(range(6, len(sources))))
    pool.drop([7])  # before it joined
    results = {}
    while len(pool):
        results.update(pool.step())
    assert sorted(results) == [0, 2, 3, 5, 6, 8]
    check_same([results[i] for i in sorted(results)], [expected[i] for i in sorted(results)])
