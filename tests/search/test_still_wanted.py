"""A search asked `still_wanted` once a step (serve's timed-out or abandoned requests): sentences no longer wanted
leave the batch at the next step without changing the others' hypotheses, and a batch of none wanted stops."""

from collections import Counter

import numpy as np
import pytest
import torch
from host_syncs import SyncLog

from nmt_cli.config import SearchConfig
from nmt_cli.data.dataset import load_vocab
from nmt_cli.search.translate import SearchRequest, Translator, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

SOURCES = [np.array(s) for s in ([5, 6, 7], [8, 9, 10, 11, 12], [4], [13, 14, 15, 16], [17, 18])]


@pytest.fixture
def counted(tiny_model, toy_data_bin):
    """A Translator whose decoder records the rows of each step it runs."""
    translator = Translator(tiny_model, load_vocab(toy_data_bin), torch.device("cpu"))
    rows = []
    decode_step = tiny_model.decode_step
    tiny_model.decode_step = lambda prev, cache: rows.append(prev.shape[0]) or decode_step(prev, cache)
    yield translator, rows
    del tiny_model.decode_step


def unwanted_after(rows, step, gone):
    """still_wanted: every sentence, until `step` decoder steps have run; then all but those in `gone`."""
    return lambda: [not (len(rows) > step and i in gone) for i in range(len(SOURCES))]


CONFIGS = {
    "beam": SearchConfig(beam=4, nbest=2, max_len_a=0, max_len_b=12, min_len=10),
    "greedy": SearchConfig(beam=1, max_len_a=0, max_len_b=12, min_len=10),
    "sampling": SearchConfig(sampling=True, beam=1, nbest=3, max_len_a=0, max_len_b=12, min_len=10, seed=2),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_sentence_no_longer_wanted_leaves_without_changing_the_others(counted, name):
    translator, rows = counted
    cfg = CONFIGS[name]
    alone = translate(translator, SearchRequest(SOURCES, cfg, 1000))
    full_rows = list(rows)
    rows.clear()
    k = 1
    stopped = translate(translator, SearchRequest(SOURCES, cfg, 1000), still_wanted=unwanted_after(rows, 2, {k}))
    for i, (a, b) in enumerate(zip(alone, stopped)):
        if i == k:
            continue
        assert [h.tokens for h in a] == [h.tokens for h in b], i
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
    assert stopped[k]  # a result per sentence still comes back (to be discarded; beam's: nothing finished)
    if name == "beam":  # beam search drops its rows from the batch at once: 4 fewer a step from step 3 on
        assert rows[:3] == full_rows[:3] and all(r == f - cfg.beam for r, f in zip(rows[3:], full_rows[3:]))
    assert len(rows) == len(full_rows)  # the others still run to their forced length


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_batch_of_sentences_no_longer_wanted_stops_at_the_next_step(counted, name):
    translator, rows = counted
    every = set(range(len(SOURCES)))
    results = translate(
        translator, SearchRequest(SOURCES, CONFIGS[name], 1000), still_wanted=unwanted_after(rows, 2, every)
    )
    assert len(rows) == 3  # forced to 11 steps, stopped after the third
    assert len(results) == len(SOURCES)


def test_a_batch_no_longer_wanted_before_it_starts_is_not_searched(counted):
    translator, rows = counted
    results = translate(
        translator, SearchRequest(SOURCES, CONFIGS["beam"], 1000), still_wanted=lambda: [False] * len(SOURCES)
    )
    assert rows == [] and len(results) == len(SOURCES)


def test_asking_still_wanted_adds_no_wait_for_the_device(counted):
    """The answers are host booleans: the step's one sync (int(done.sum())) stays the only one."""
    translator, rows = counted
    cfg = CONFIGS["beam"]
    with SyncLog() as log:
        translate(translator, SearchRequest(SOURCES, cfg, 1000))
    plain = Counter(call for call, _ in log.syncs)
    steps = len(rows)
    rows.clear()
    with SyncLog() as log:
        translate(translator, SearchRequest(SOURCES, cfg, 1000), still_wanted=unwanted_after(rows, 2, {0, 3}))
    assert len(rows) == steps
    assert Counter(call for call, _ in log.syncs) == plain
