"""In-flight batching over fixed slots (search/in_flight.py) against beam.py's search of each sentence: sentences
admitted into free slots at other steps, at their own positions beside the others, get the hypotheses and scores
they get alone, for every search setting, eagerly and through the captured-step bookkeeping (with a capture that
warms up as CUDA's does); sentences no longer wanted free their slots; one host read a step except where a
sentence ends."""

import numpy as np
import pytest
import torch
from host_syncs import SyncLog

from nmt_cli.config import SearchConfig
from nmt_cli.data.batching import pad_sources
from nmt_cli.data.vocab import PAD
from nmt_cli.search.beam import beam_search, max_lengths
from nmt_cli.search.ensemble import Ensemble
from nmt_cli.search.graphs import Bucket, StepGraphs
from nmt_cli.search.in_flight import InFlight, Stepper, in_flight_steps, longest_source
from nmt_cli.search.slot_state import SlotState
from nmt_cli.search.translate import load_translator
from nmt_cli.steps import run_to_end
from tests.search.test_slots import assert_same

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

SETTINGS = [
    SearchConfig(beam=4),
    SearchConfig(beam=5, lenpen=0.6, lenpen_style="fairseq", nbest=3),
    SearchConfig(beam=3, lenpen=1.0, lenpen_style="fairseq", min_len=5),
    SearchConfig(beam=4, max_len_a=0.5, max_len_b=2, nbest=4, unkpen=2.0),
    SearchConfig(beam=2, max_len_a=0.0, max_len_b=40, min_len=36, nbest=2),  # past the first window of positions
]


def warming_capture(run):
    """As CUDA captures: the step runs once when captured (its warm-up, undone by the caller), then replays."""
    run()
    return run


@pytest.fixture
def copy_translator(trained_copy_checkpoint, cpu_matmul_route):
    return load_translator(trained_copy_checkpoint, torch.device("cpu"), None)[0]


def encode_with(model):
    def encode(sources):
        src = pad_sources([np.asarray(s, dtype=np.int64) for s in sources])
        return model.encode(src, src.eq(PAD)), torch.tensor([len(s) for s in sources])

    return encode


def alone(model, sources, cfg, n_pieces):
    """Each sentence's beam.py search in a batch of its own."""
    encode = encode_with(model)
    with torch.inference_mode():
        return [beam_search(model, *encode([s]), cfg, n_pieces)[0] for s in sources]


class Arrivals:
    """`InFlight.admit` of a queue of sentences, each arriving at a given step (the steps counted by admit's
    calls, one a step); records what it was offered."""

    def __init__(self, arrivals):
        self.queue = list(arrivals)  # (step, source)
        self.calls, self.offers, self.slots, self.admitted = 0, [], set(), []

    def __call__(self, free, slots, longest):
        self.calls += 1
        self.offers.append((free, longest))
        self.slots.add(slots)
        ready = [s for step, s in self.queue if step <= self.calls and len(s) <= longest][:free]
        self.queue = [(step, s) for step, s in self.queue if not any(s is r for r in ready)]
        self.admitted += ready
        return ready


def search(model, first, arrivals, cfg, n_pieces, graphs=None, capacity=0, max_tokens=0, **hooks):
    encode = encode_with(model)
    with torch.inference_mode():
        enc, lens = encode(first)
    in_flight = InFlight(arrivals, capacity, max_tokens)
    return run_to_end(in_flight_steps(model, enc, lens, cfg, n_pieces, encode, in_flight, graphs=graphs, **hooks))


def sentences(seed, lengths):
    g = np.random.default_rng(seed)
    return [g.integers(4, 20, n) for n in lengths]


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("cfg", SETTINGS, ids=range(len(SETTINGS)))
def test_admitted_sentences_search_as_they_would_alone(copy_translator, cfg, graphs):
    model, n_pieces = copy_translator.model, copy_translator.vocab.n_pieces
    first = sentences(1, [3, 12, 7])
    later = sentences(2, [5, 1, 14, 9, 2, 40, 6])
    arrivals = Arrivals(zip([1, 2, 2, 4, 7, 7, 12], later))
    step_graphs = StepGraphs(warming_capture) if graphs else None
    got = search(model, first, arrivals, cfg, n_pieces, step_graphs)
    assert len(arrivals.admitted) == len(later)  # all of them, into slots freed at other steps
    order = [next(i for i, s in enumerate(later) if s is a) for a in arrivals.admitted]
    assert_same(alone(model, first + [later[i] for i in order], cfg, n_pieces), got)
    assert {free for free, _ in arrivals.offers} >= {1}  # a bucket of 4 slots: admitted into free ones
    if graphs and cfg.min_len > 32:
        assert step_graphs.n_captures == 2  # windows of 32 and 64 captured lazily, their warm-up runs undone


def test_an_ensemble_admits_as_well(copy_translator, tiny_checkpoint):
    tiny = load_translator(tiny_checkpoint, torch.device("cpu"), None)[0]
    model = Ensemble([copy_translator.model, tiny.model], (0.7, 0.3))
    # min_len: the first sentences are still searched at step 5, whatever the weights (the tiny checkpoint is
    # trained where the test runs, so its outputs, and where they end, differ between CPUs)
    cfg, n_pieces = SearchConfig(beam=3, nbest=2, min_len=6), copy_translator.vocab.n_pieces
    first, later = sentences(3, [4, 8]), sentences(4, [6, 2, 10])
    arrivals = Arrivals(zip([1, 3, 5], later))
    got = search(model, first, arrivals, cfg, n_pieces, StepGraphs(warming_capture))
    order = [next(i for i, s in enumerate(later) if s is a) for a in arrivals.admitted]
    assert len(order) == 3
    assert_same(alone(model, first + [later[i] for i in order], cfg, n_pieces), got)


def test_capacity_and_what_fits(copy_translator):
    """The bucket holds `capacity` sentences from the start; a source longer than the bucket's fits waits."""
    model, n_pieces = copy_translator.model, copy_translator.vocab.n_pieces
    cfg = SearchConfig(beam=2)
    long_one = np.arange(70) % 16 + 4  # longer than the first batch's source bucket of 64
    arrivals = Arrivals([(1, s) for s in sentences(5, [3, 4, 5])] + [(1, long_one)])
    got = search(model, sentences(6, [2]), arrivals, cfg, n_pieces, capacity=5)
    assert arrivals.offers[0][0] == 7 and arrivals.slots == {8}  # 8 slots, 1 taken
    assert len(got) == 4 and len(arrivals.queue) == 1
    assert arrivals.offers[0][1] == longest_source(64, cfg, 128, model.max_positions) < 70
    bounded = Arrivals([(1, s) for s in sentences(5, [3, 4, 5])])
    search(model, sentences(6, [2]), bounded, cfg, n_pieces, capacity=32, max_tokens=128)  # 2 sources of 64
    assert bounded.offers[0][0] == 1 and bounded.slots == {2}  # 2 slots, not 32: within the token budget


def test_unwanted_sentences_free_their_slots(copy_translator):
    """A sentence no longer wanted (its client left) frees its slot at once for the next one; the others' results
    are unchanged, and it is not told."""
    model, n_pieces = copy_translator.model, copy_translator.vocab.n_pieces
    cfg = SearchConfig(beam=3, max_len_a=0.0, max_len_b=40, min_len=40)  # none ends early
    first, later = sentences(7, [5, 6]), sentences(8, [4])
    arrivals = Arrivals([(1, later[0])])
    asked, told = [], []

    def still_wanted():
        asked.append(1)
        return [True, len(asked) < 3, True][: 2 + len(arrivals.admitted)]  # the second one's client left at step 3

    tell = lambda i, h: told.append((i, h))  # noqa: E731
    got = search(model, first, arrivals, cfg, n_pieces, still_wanted=still_wanted, on_done=tell)
    assert [free for free, _ in arrivals.offers[:2]] == [0, 1]  # told the slots at the first step, full
    assert arrivals.admitted == later  # into the slot freed at step 3
    assert len(got) == 2  # the first batch's: the admitted one's results are told, not kept
    assert sorted(i for i, _ in told) == [0, 2]
    assert_same(alone(model, [first[0], later[0]], cfg, n_pieces), [got[0], dict(told)[2]])


def test_a_stopped_sentence_stays_done_with_its_rows_parked(copy_translator):
    """Each step counts `done` anew from the finished hypotheses; a sentence stopped (its client left) stays done and
    its rows at position 0, where they had stepped on, past the buffers, while the batch took new sentences."""
    model, n_pieces = copy_translator.model, copy_translator.vocab.n_pieces
    cfg = SearchConfig(beam=2, max_len_a=0.0, max_len_b=30, min_len=30)  # none ends before the buffers' 32
    with torch.inference_mode():
        enc, lens = encode_with(model)(sentences(9, [5, 6]))
        cache = model.init_slots(enc, 2, n_positions=32, source_len=enc.memory.shape[1])
        state = SlotState.start(max_lengths(lens, cfg, model.max_positions), 2, 2, 32, cfg, n_pieces)
        stepper = Stepper(model, Bucket(4, 32, enc.memory.shape[1]), cache, state, None, 0)
        for position in range(3):
            stepper.step(position)
        stepper.stop([1])
        for position in range(3, 31):
            stepper.step(position)
    assert state.done.tolist() == [True, True]  # the first at its maximum length, the second stopped
    assert cache.step.tolist()[2:] == [0, 0] and int(state.n_live) == 0


def test_one_host_read_a_step(copy_translator):
    """One host read a step (the count of sentences searching); the others only on steps where some sentence
    ends (its done flags and its results' copies: 5 at most, at most once per sentence)."""
    model, n_pieces = copy_translator.model, copy_translator.vocab.n_pieces
    first = sentences(9, [6, 2, 9, 4])
    encode = encode_with(model)
    with torch.inference_mode():
        enc, lens = encode(first)
    steps = in_flight_steps(model, enc, lens, SearchConfig(beam=4), n_pieces, encode, InFlight(lambda f, b, n: []))
    n_steps = 1
    with SyncLog() as log:
        try:
            while True:
                next(steps)
                n_steps += 1
        except StopIteration:
            pass
    per_step = [s for s in log.syncs if s[0] == "__int__"]
    assert len(per_step) == n_steps
    others = [s for s in log.syncs if s[0] != "__int__" and "src_lens" not in s[1]]
    assert len(others) <= 1 + 5 * len(first)  # the batch's lengths on the host (no device read), then the ends
