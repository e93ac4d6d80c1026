"""The bookkeeping of the captured decoder steps (search/graphs.py) on the CPU, with a capture that counts and
replays by running the step again: buckets, a captured step reused by every batch of its bucket, a bounded number
of captures, batches that move to smaller buckets as their sentences finish, and no captured step used for shapes
outside its bucket."""

import numpy as np
import pytest
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.batching import pad_sources
from nmt_cli.data.vocab import PAD
from nmt_cli.search.beam import beam_search
from nmt_cli.search.graphs import Bucket, StepGraphs, bucket_of, sentence_bucket
from nmt_cli.search.slot_state import SlotState
from nmt_cli.search.slots import slot_search, slot_steps

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


class CountingCapture:
    """Captures by keeping the step to run it again; counts captures and replays."""

    def __init__(self):
        self.captures, self.replays = 0, 0

    def __call__(self, run):
        self.captures += 1

        def replay():
            self.replays += 1
            run()

        return replay


class WarmingCapture(CountingCapture):
    """As CUDA captures (graphs.CudaCapture): the step runs once when captured (its warm-up), then replays."""

    def __call__(self, run):
        run()
        return super().__call__(run)


def test_buckets():
    assert [sentence_bucket(n) for n in (1, 2, 3, 5, 8, 9, 32, 33, 64, 65, 600)] == [
        *(1, 2, 4, 8, 8, 16, 32, 64, 64),
        *(128, 640),  # beyond 64 sentences, multiples of 64
    ]
    assert bucket_of(5, 4, 1, 7, 1024) == Bucket(32, 64, 64)
    assert bucket_of(32, 4, 64, 64, 1024) == Bucket(128, 64, 64)
    assert bucket_of(33, 4, 65, 65, 1024) == Bucket(256, 128, 128)
    assert bucket_of(130, 4, 65, 65, 1024) == Bucket(192 * 4, 128, 128)
    assert bucket_of(1, 5, 100, 20, 100) == Bucket(5, 100, 64)  # within the model's positions
    with pytest.raises(AssertionError):
        bucket_of(1, 4, 101, 20, 100)


def encoded(tiny_model, lengths, seed=0):
    g = np.random.default_rng(seed)
    src = pad_sources([g.integers(4, 24, n) for n in lengths])
    with torch.inference_mode():
        return tiny_model.encode(src, src.eq(PAD)), torch.tensor(lengths)


def test_a_bucket_is_captured_once_and_reused(tiny_model):
    capture = CountingCapture()
    graphs = StepGraphs(capture, max_graphs=2)
    cfg = SearchConfig(beam=2, max_len_a=0.0, max_len_b=4, min_len=4)  # 5 steps a batch
    for lengths in ([3, 5, 2], [6, 1, 4, 2], [1]):  # buckets of 4, 4 and 1 sentences
        enc, lens = encoded(tiny_model, lengths)
        want = beam_search(tiny_model, enc, lens, cfg)
        got = slot_search(tiny_model, enc, lens, cfg, graphs=graphs)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        assert [h.score for hyps in got for h in hyps] == pytest.approx([h.score for hyps in want for h in hyps])
    assert capture.captures == 2 == graphs.n_captures  # [8, 64, 64] once for two batches, then [2, 64, 64]
    assert capture.replays == 15
    assert list(graphs.graphs) == [Bucket(8, 64, 64), Bucket(2, 64, 64)]
    enc, lens = encoded(tiny_model, [3] * 9)  # a third bucket drops the least recently used one
    slot_search(tiny_model, enc, lens, cfg, graphs=graphs)
    assert list(graphs.graphs) == [Bucket(2, 64, 64), Bucket(32, 64, 64)]
    enc, lens = encoded(tiny_model, [2, 2, 2])  # the dropped bucket is captured again
    slot_search(tiny_model, enc, lens, cfg, graphs=graphs)
    assert capture.captures == 4


def test_finished_sentences_move_to_smaller_buckets(tiny_model):
    """As a batch's sentences finish it moves to the bucket of its live sentences once that holds at most half of
    its sentences (the same positions and source length): each smaller bucket is captured once, over the moved
    batch, and a later batch of those buckets loads its moved state into them."""
    capture = WarmingCapture()  # each capture runs the step once, as CUDA's warm-up does
    graphs = StepGraphs(capture)
    cfg = SearchConfig(beam=2, max_len_a=1.0, max_len_b=0, nbest=2)  # each sentence stops by its own length
    enc, lens = encoded(tiny_model, [1, 1, 2, 2, 3, 4, 5, 6, 8, 10, 13, 16, 20])  # the bucket of 16 sentences
    want = beam_search(tiny_model, enc, lens, cfg)
    for _ in range(2):
        got = slot_search(tiny_model, enc, lens, cfg, graphs=graphs)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        assert [h.score for hyps in got for h in hyps] == pytest.approx([h.score for hyps in want for h in hyps])
        buckets = list(graphs.graphs)
        rows = [bucket.rows for bucket in buckets]
        assert rows[0] == 32 and len(rows) >= 3 and all(2 * b <= a for a, b in zip(rows, rows[1:])), rows
        assert {bucket._replace(rows=0) for bucket in buckets} == {Bucket(0, 64, 64)}
        assert capture.captures == len(buckets)  # the second batch captures nothing


@torch.inference_mode()
def test_a_captured_step_is_never_used_outside_its_bucket(tiny_model):
    graphs = StepGraphs(CountingCapture())
    enc, _ = encoded(tiny_model, [3, 5])
    bucket = Bucket(4, 64, 64)
    cfg = SearchConfig(beam=2)

    def state_of(n_sentences):
        return SlotState.start(torch.full((n_sentences,), 10), n_sentences, 2, 64, cfg, None)

    cache = tiny_model.init_slots(enc, 2, n_positions=64, source_len=64)
    with pytest.raises(AssertionError):  # a state of other rows
        graphs.step_for(tiny_model, cache, state_of(3), bucket)
    captured, batch = graphs.step_for(tiny_model, cache, state_of(2), bucket)
    captured.held = False  # its batch ended: the next batch of the bucket loads its cache into this one's
    other_length = tiny_model.init_slots(enc, 2, n_positions=64, source_len=128)
    with pytest.raises(AssertionError):  # a batch of another source length is not loaded into the bucket's cache
        graphs.step_for(tiny_model, other_length, state_of(2), bucket)
    assert captured.step(batch, 0).prev.shape == (4,)
    again, next_batch = graphs.step_for(tiny_model, cache, state_of(2), bucket)
    assert again is captured and next_batch != batch
    with pytest.raises(AssertionError):  # the first batch's search may not step on the second one's buffers
        captured.step(batch, 1)


def test_batches_searched_in_turn_hold_captures_of_their_own(tiny_model):
    """serve's worker steps two batches in turn: a second batch of a bucket whose captured step a running batch
    holds gets a capture of its own, and both translate as they do alone; once they end, a later batch reuses one."""
    capture = CountingCapture()
    graphs = StepGraphs(capture)
    cfg = SearchConfig(beam=2, max_len_a=1.0, max_len_b=2, nbest=2)
    batches = [encoded(tiny_model, lengths, seed) for seed, lengths in enumerate(([3, 5, 2, 4], [6, 1, 4, 2]))]
    want = [beam_search(tiny_model, enc, lens, cfg) for enc, lens in batches]
    searches = [slot_steps(tiny_model, enc, lens, cfg, graphs=graphs) for enc, lens in batches]
    got: list = [None, None]
    while any(g is None for g in got):  # one step of each in turn
        for i, search in enumerate(searches):
            if got[i] is None:
                try:
                    next(search)
                except StopIteration as stop:
                    got[i] = stop.value
    for w, g in zip(want, got):
        assert [[h.tokens for h in hyps] for hyps in g] == [[h.tokens for h in hyps] for hyps in w]
        assert [h.score for hyps in g for h in hyps] == pytest.approx([h.score for hyps in w for h in hyps])
    first = Bucket(8, 64, 64)
    assert len(graphs.graphs[first]) == 2  # the first bucket, captured for each batch
    assert not any(c.held for copies in graphs.graphs.values() for c in copies)  # both searches let go
    n_captures = capture.captures
    slot_search(tiny_model, *batches[0], cfg, graphs=graphs)
    assert capture.captures == n_captures


def test_an_abandoned_search_lets_its_captured_step_go(tiny_model):
    graphs = StepGraphs(CountingCapture())
    enc, lens = encoded(tiny_model, [3, 5])
    search = slot_steps(
        tiny_model, enc, lens, SearchConfig(beam=2, max_len_a=0.0, max_len_b=6, min_len=6), graphs=graphs
    )
    next(search)
    (captured,) = graphs.graphs[Bucket(4, 64, 64)]
    assert captured.held
    search.close()  # a batch dropped before its end (a failed step's, a stopped worker's)
    assert not captured.held


def test_a_step_reads_the_window_of_its_position_each_captured_when_first_needed(tiny_model, monkeypatch):
    """A batch of 51 steps in a bucket of 64 positions: windows of 32 and 64 positions, each captured once, by the
    step that first needs it (its warm-up run rewritten by the replay), and the results of the eager search."""
    windows = []
    decode_slots = type(tiny_model).decode_slots

    def recording(self, prev, rows, cache, window=None):
        windows.append(window)
        return decode_slots(self, prev, rows, cache, window)

    capture = WarmingCapture()
    graphs = StepGraphs(capture)
    cfg = SearchConfig(beam=4, max_len_a=0.0, max_len_b=50, min_len=50)  # 51 steps
    enc, lens = encoded(tiny_model, [3, 5, 2])
    want = beam_search(tiny_model, enc, lens, cfg)
    monkeypatch.setattr(type(tiny_model), "decode_slots", recording)
    for _ in range(2):  # the second batch replays the first one's captures
        windows.clear()
        got = slot_search(tiny_model, enc, lens, cfg, graphs=graphs)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        assert [h.score for hyps in got for h in hyps] == pytest.approx([h.score for hyps in want for h in hyps])
    assert list(graphs.graphs) == [Bucket(16, 64, 64)]
    assert capture.captures == graphs.n_captures == 2 and capture.replays == 2 * 51
    assert windows == [32] * 32 + [64] * 19  # the second batch's steps, one replay each


def test_batches_of_other_search_settings_replay_the_same_captured_step(tiny_model):
    """The minimum length, the unknown-piece penalty and the length penalties are tensors of the batch's state, not
    constants of the graph: batches with other settings replay one bucket's captured step, each getting beam.py's
    results."""
    capture = WarmingCapture()
    graphs = StepGraphs(capture)
    enc, lens = encoded(tiny_model, [3, 5, 2, 4])
    settings = [
        SearchConfig(beam=2, max_len_a=1.0, max_len_b=3, nbest=2),
        SearchConfig(beam=2, max_len_a=1.0, max_len_b=3, min_len=4, unkpen=2.0, lenpen=1.0, lenpen_style="fairseq"),
    ]
    for cfg in settings:
        want = beam_search(tiny_model, enc, lens, cfg)
        got = slot_search(tiny_model, enc, lens, cfg, graphs=graphs)
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        assert [h.score for hyps in got for h in hyps] == pytest.approx([h.score for hyps in want for h in hyps])
    assert capture.captures == len(graphs.graphs) and len(graphs.graphs[Bucket(8, 64, 64)]) == 1  # once a bucket
