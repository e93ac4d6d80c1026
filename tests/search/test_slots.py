"""The beam search over fixed slots (search/slots.py) against beam.py's: the same hypotheses and scores for every
search setting, on a single model and an ensemble, through the captured-step bookkeeping (search/graphs.py, with a
capture that runs the step eagerly), with batches that move to fewer slots as their sentences finish; one host read
a step; the searches it leaves to beam.py."""

import json
from collections import Counter

import numpy as np
import pytest
import torch
from host_syncs import SyncLog

from nmt_cli.config import SearchConfig
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.search.beam import beam_search
from nmt_cli.search.ensemble import Ensemble
from nmt_cli.search.graphs import StepGraphs, run_eagerly
from nmt_cli.search.prefix import prefix_source
from nmt_cli.search.slot_state import SlotState
from nmt_cli.search.slots import SlotSearch, slot_search, slot_search_for
from nmt_cli.search.translate import SearchRequest, Translator, load_translator, translate, translate_steps

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

SETTINGS = [
    SearchConfig(beam=4),  # GNMT, alpha 0.6
    SearchConfig(beam=4, lenpen=0.0),
    SearchConfig(beam=5, lenpen=0.6, lenpen_style="fairseq", nbest=3),
    SearchConfig(beam=3, lenpen=1.0, lenpen_style="fairseq", min_len=5),
    SearchConfig(beam=4, max_len_a=0.5, max_len_b=2, nbest=4),
    SearchConfig(beam=2, max_len_a=0.0, max_len_b=6, min_len=6, nbest=2),
    SearchConfig(beam=4, unkpen=2.0, lenpen=1.5),
]


def eager_capture(run):
    """A capture that replays by running the step again: the bookkeeping of CUDA graphs, on the CPU."""
    return run


def sources_of(toy_data_bin, n=20):
    """Test sentences of several lengths, and two shorter and longer ones."""
    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(n)]
    g = np.random.default_rng(0)
    return [*sources, g.integers(4, 20, 1), g.integers(4, 20, 17)]


def assert_same(expected, got):
    assert len(expected) == len(got)
    for want, have in zip(expected, got):
        assert [h.tokens for h in have] == [h.tokens for h in want]
        assert [h.score for h in have] == pytest.approx([h.score for h in want], abs=1e-4)
        for w, h in zip(want, have):
            assert h.positional_scores == pytest.approx(w.positional_scores, abs=1e-4)


@pytest.fixture
def copy_translator(trained_copy_checkpoint, cpu_matmul_route):
    """The trained copy model, loaded (and packed) on the test's matmul route."""
    return load_translator(trained_copy_checkpoint, torch.device("cpu"), None)[0]


@pytest.mark.parametrize("cfg", SETTINGS, ids=range(len(SETTINGS)))
def test_fixed_slots_translate_as_the_beam_search_does(copy_translator, toy_data_bin, cfg):
    sources = sources_of(toy_data_bin)
    expected = translate(copy_translator, SearchRequest(sources, cfg, 120))  # several batches
    for slots in (SlotSearch(StepGraphs(eager_capture)),):
        fixed = Translator(copy_translator.model, copy_translator.vocab, copy_translator.device, slots=slots)
        got = translate(fixed, SearchRequest(sources, cfg, 120))
        assert_same(expected, got)


@pytest.fixture
def moves(monkeypatch):
    """The sentence counts that batches' slots move to (SlotState.select), in order."""
    counts = []
    select = SlotState.select

    def recording_select(self, keep):
        counts.append(keep.shape[0])
        return select(self, keep)

    monkeypatch.setattr(SlotState, "select", recording_select)
    return counts


def test_finished_sentences_move_to_fewer_slots(copy_translator, moves):
    """Sentences that finish at very different steps: the batch moves to fewer slots (the live sentences' bucket, at
    most half of them, the bucket's fill sentences and finished ones moved along), and the results stay beam.py's,
    nbest included."""
    g = np.random.default_rng(3)
    sources = [g.integers(4, 20, n) for n in (1, 2, 2, 3, 4, 5, 6, 7, 9, 12, 16, 21, 26, 30)]  # 14: a bucket of 16
    enc, lens = encoded(copy_translator, sources)
    model, n_pieces = copy_translator.model, copy_translator.vocab.n_pieces
    for cfg in (SearchConfig(beam=4, nbest=3), SearchConfig(beam=3, lenpen=1.0, lenpen_style="fairseq", nbest=2)):
        moves.clear()
        want = beam_search(model, enc, lens, cfg, n_pieces)
        assert_same(want, slot_search(model, enc, lens, cfg, n_pieces, graphs=StepGraphs(eager_capture)))
        counts = [16, *moves]
        assert len(moves) >= 2 and all(b <= 0.5 * a for a, b in zip(counts, counts[1:])), counts
        assert all(b & (b - 1) == 0 for b in moves), moves  # bucket sizes: powers of two


def test_the_outputs_end_at_different_steps(copy_translator, toy_data_bin):
    """The rows above test what they claim: in one batch some sentences finish before others."""
    results = translate(copy_translator, SearchRequest(sources_of(toy_data_bin), SETTINGS[0], 10_000))
    assert len({len(hyps[0].tokens) for hyps in results}) > 3


def test_beam_one_and_an_untrained_model(tiny_checkpoint, toy_data_bin):
    """Beam 1 (translate runs greedy search there: compared with beam_search itself) and outputs that run to their
    maximum length."""
    translator = load_translator(tiny_checkpoint, torch.device("cpu"), None)[0]
    sources = sources_of(toy_data_bin, 6)
    for cfg in (SearchConfig(beam=1, max_len_b=10), SearchConfig(beam=4, max_len_a=0.5, max_len_b=3)):
        for source in (sources, sources[2:3]):
            enc, lens = encoded(translator, source)
            want = beam_search(translator.model, enc, lens, cfg, translator.vocab.n_pieces)
            step_graphs = StepGraphs(eager_capture)
            got = slot_search(translator.model, enc, lens, cfg, translator.vocab.n_pieces, graphs=step_graphs)
            assert_same(want, got)


def encoded(translator, sources):
    from nmt_cli.data.batching import pad_sources
    from nmt_cli.data.vocab import PAD

    src = pad_sources([np.asarray(s, dtype=np.int64) for s in sources])
    with torch.inference_mode():
        return translator.model.encode(src, src.eq(PAD)), torch.tensor([len(s) for s in sources])


def test_an_ensemble_over_fixed_slots(copy_translator, trained_copy_checkpoint, toy_data_bin, tmp_path, moves):
    ckpt = torch.load(trained_copy_checkpoint, map_location="cpu", weights_only=True)
    g = torch.Generator().manual_seed(1)
    ckpt["model"] = {
        k: v + 0.1 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in ckpt["model"].items()
    }
    torch.save(ckpt, tmp_path / "other.pt")
    other = load_translator(tmp_path / "other.pt", torch.device("cpu"), None)[0].model
    ensemble = Ensemble([copy_translator.model, other], [0.7, 0.3])
    plain = Translator(ensemble, copy_translator.vocab, torch.device("cpu"))
    sources, cfg = sources_of(toy_data_bin, 8), SearchConfig(beam=4, nbest=2)
    expected = translate(plain, SearchRequest(sources, cfg, 10_000))
    for slots in (SlotSearch(StepGraphs(eager_capture)),):
        fixed = Translator(ensemble, copy_translator.vocab, torch.device("cpu"), slots=slots)
        moves.clear()
        assert_same(expected, translate(fixed, SearchRequest(sources, cfg, 10_000)))
        assert moves  # its batch moved to fewer slots


def test_fixed_slots_wait_for_the_device_once_a_step(copy_translator, toy_data_bin, slot_steps_taken):
    """What beam.py's search waits for (tests/search/test_beam_syncs.py): collect's four copies and the source
    lengths once a batch, and one read a step (how many sentences are still searching), moves to fewer slots
    included."""
    slots = SlotSearch(StepGraphs(eager_capture))
    translator = Translator(copy_translator.model, copy_translator.vocab, torch.device("cpu"), slots=slots)
    sources = sources_of(toy_data_bin)
    for cfg in (SearchConfig(beam=4, max_len_a=0, max_len_b=10, min_len=10), SearchConfig(beam=4)):
        slot_steps_taken.clear()
        with SyncLog() as log:
            translate(translator, SearchRequest(sources, cfg, 10_000))
        n_steps = len(slot_steps_taken)
        syncs = Counter((call, where.rsplit(" in ", 1)[1]) for call, where in log.syncs)
        per_batch = Counter({("cpu", "collect"): 4, ("cpu", "slot_steps"): 1})
        assert syncs == per_batch + Counter({("__int__", "slot_steps"): n_steps}), syncs
        if cfg.min_len == 10:
            assert n_steps == 11


def test_other_searches_keep_the_beam_search(copy_translator, toy_data_bin, slot_steps_taken):
    """Prefixes, the n-gram ban, sampling and beam 1 run beam.py's or greedy.py's search, as without slots."""
    calls = slot_steps_taken
    translator = Translator(
        copy_translator.model, copy_translator.vocab, torch.device("cpu"), slots=SlotSearch(StepGraphs(eager_capture))
    )
    sources = sources_of(toy_data_bin, 6)
    prefixes = prefix_source([s[:2] for s in sources])
    translate(translator, SearchRequest(sources, SearchConfig(beam=4), 10_000, constraints=prefixes))
    for cfg in (SearchConfig(beam=4, no_repeat_ngram_size=2), SearchConfig(beam=1), SearchConfig(sampling=True)):
        translate(translator, SearchRequest(sources, cfg, 10_000))
    assert calls == []
    translate(translator, SearchRequest(sources, SearchConfig(beam=4), 10_000))
    assert calls


def with_slots(translator):
    """The translator, searching over fixed slots."""
    slots = SlotSearch(StepGraphs(eager_capture))
    return Translator(translator.model, translator.vocab, translator.device, slots=slots)


def test_a_sentence_is_told_as_it_finishes_as_the_beam_search_tells_it(copy_translator, toy_data_bin):
    """serve's early answers (`on_done`): each sentence that finishes before its batch's last step is told once, at
    the step beam.py's search tells it, with the hypotheses the search returns for it; a bucket's copies never."""
    sources, cfg = sources_of(toy_data_bin, 13), SearchConfig(beam=4, nbest=2)  # 15 sentences: a bucket of 16

    def told_by(translator):
        told, steps = [], [0]
        search = translate_steps(
            translator, SearchRequest(sources, cfg, 10_000), on_done=lambda i, h: told.append((i, steps[0], h))
        )
        while True:
            try:
                next(search)
            except StopIteration as stop:
                return told, stop.value
            steps[0] += 1

    want_told, want = told_by(copy_translator)
    told, got = told_by(with_slots(copy_translator))
    assert_same(want, got)
    assert len(want_told) > 3
    assert [(i, step) for i, step, _ in told] == [(i, step) for i, step, _ in want_told]
    assert all(hyps == got[i] for i, _, hyps in told)


def test_sentences_no_longer_wanted_stop_over_fixed_slots(copy_translator, toy_data_bin, slot_steps_taken):
    """serve's `still_wanted`: a sentence no longer wanted stops at the next step without changing the others'
    results, and a batch of none wanted stops."""
    sources = sources_of(toy_data_bin, 6)
    # every hypothesis is 12 tokens long: the batch's length is the same whichever sentences stop, whatever the
    # weights (the checkpoint is trained where the test runs, so where free lengths end differs between CPUs)
    n, cfg = len(sources), SearchConfig(beam=4, nbest=2, max_len_a=0, max_len_b=12, min_len=12)
    fixed = with_slots(copy_translator)
    alone = translate(fixed, SearchRequest(sources, cfg, 10_000))
    n_steps = len(slot_steps_taken)
    slot_steps_taken.clear()
    gone = {1, 4}
    stopped = translate(
        fixed,
        SearchRequest(sources, cfg, 10_000),
        still_wanted=lambda: [len(slot_steps_taken) <= 2 or i not in gone for i in range(n)],
    )
    others = [i for i in range(len(sources)) if i not in gone]
    assert_same([alone[i] for i in others], [stopped[i] for i in others])
    assert not all(len(h) == cfg.nbest and h == alone[i] for i, h in enumerate(stopped) if i in gone)
    assert len(slot_steps_taken) == n_steps  # the others run to their end
    slot_steps_taken.clear()
    translate(fixed, SearchRequest(sources, cfg, 10_000), still_wanted=lambda: [len(slot_steps_taken) <= 2] * n)
    assert len(slot_steps_taken) == 3 < n_steps


def test_the_choice_of_search():
    cpu = torch.device("cpu")
    assert slot_search_for(False, True, cpu) is None  # beam.py's search unless asked
    assert slot_search_for(True, True, cpu).graphs.capture is run_eagerly  # never a CUDA call on the CPU
    assert slot_search_for(False, True, torch.device("cuda")) is None
    assert not slot_search_for(True, False, torch.device("cuda")).cuda_graphs


def test_generate_with_fixed_slots_writes_what_the_default_search_writes(trained_copy_checkpoint, toy_corpus):
    from click.testing import CliRunner

    from nmt_cli.cli import cli

    def generate(*extra):
        args = ["generate", "--path", trained_copy_checkpoint, "--input", toy_corpus / "test.src", "--device", "cpu"]
        r = CliRunner().invoke(
            cli, [str(a) for a in [*args, "--beam", "3", "--nbest", "2", "--output-format", "jsonl"]] + list(extra)
        )
        assert r.exit_code == 0, r.output
        return [json.loads(line) for line in r.stdout.splitlines()]

    default, fixed = generate(), generate("--fixed-slots", "--cuda-graphs")  # no CUDA: without graphs
    assert [[h["text"] for h in r["hypotheses"]] for r in fixed] == [
        [h["text"] for h in r["hypotheses"]] for r in default
    ]
    scores = [h["score"] for r in fixed for h in r["hypotheses"]]
    assert scores == pytest.approx([h["score"] for r in default for h in r["hypotheses"]], abs=1e-3)


def test_under_bf16_autocast(tiny_model, toy_data_bin):
    """Keys and values kept in bf16 (autocast's dtype) hold what beam.py's float32 cache holds of them."""
    from nmt_cli.data.dataset import load_vocab

    vocab, cpu = load_vocab(toy_data_bin), torch.device("cpu")
    sources, cfg = sources_of(toy_data_bin, 6), SearchConfig(beam=4, max_len_b=8, nbest=2)
    expected = translate(Translator(tiny_model, vocab, cpu, torch.bfloat16), SearchRequest(sources, cfg, 10_000))
    for slots in (SlotSearch(StepGraphs(eager_capture)),):
        assert_same(
            expected,
            translate(Translator(tiny_model, vocab, cpu, torch.bfloat16, slots), SearchRequest(sources, cfg, 10_000)),
        )
