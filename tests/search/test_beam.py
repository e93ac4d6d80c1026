"""Beam search against hand-computed beams (a fake decoder with known step distributions), greedy, and batching."""

import math

import numpy as np
import pytest
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import EOS
from nmt_cli.model.cache import DecoderCache, append_step
from nmt_cli.model.transformer import EncoderOut
from nmt_cli.search.beam import BeamState, beam_search, candidate_block, length_penalty, top_candidates
from nmt_cli.search.greedy import greedy_search
from nmt_cli.search.translate import SearchRequest, Translator, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

A, B = 4, 5  # two word ids; 0-3 are pad, unk, bos, eos
V = 6


def dist(**probs):
    p = torch.full((V,), 1e-12)
    for name, value in probs.items():
        p[{"a": A, "b": B, "eos": EOS}[name]] = value
    return p.log()


# Step distributions per sentence, the same for every prefix.
TABLES = [
    [dist(a=0.6, b=0.3, eos=0.1), dist(a=0.5, eos=0.4, b=0.1), dist(a=0.2, eos=0.7, b=0.1), dist(eos=1.0)],
    [dist(eos=0.9, a=0.06, b=0.04), dist(eos=0.5, a=0.3, b=0.2), dist(eos=1.0), dist(eos=1.0)],
]


class FakeModel:
    """decode_step returns TABLES[sentence][step]; the sentence id travels in the cache's cross_k."""

    max_positions = 100

    def init_cache(self, enc, beam):
        n = enc.memory.shape[0]
        sent = enc.memory[:, :1, :1, None].clone()  # [B, 1, 1, 1] holds the sentence id
        empty = torch.zeros(n * beam, 1, 0, 1)
        return DecoderCache([empty], [empty], [sent], [sent], torch.zeros(n, 1, 1, 1))

    def decode_step(self, prev, cache):
        step = cache.length
        sent = cache.cross_k[0][:, 0, 0, 0].long()
        k = prev.shape[0] // len(sent)
        lp = torch.stack([TABLES[s][step] for s in sent.tolist()]).repeat_interleave(k, 0)
        grown = append_step(cache.self_k[0], torch.zeros(prev.shape[0], 1), cache.rows)
        return lp.clone(), DecoderCache([grown], [grown], cache.cross_k, cache.cross_v, cache.cross_bias)


def fake_encoder(sentences):
    memory = torch.tensor(sentences, dtype=torch.float)[:, None, None].expand(-1, 1, 1)
    return EncoderOut(memory, torch.zeros(len(sentences), 1, dtype=torch.bool))


def search(sentences, **kw):
    cfg = SearchConfig(**{"beam": 2, "max_len_a": 0, "max_len_b": 10, "nbest": 2, "min_len": 0, **kw})
    return beam_search(FakeModel(), fake_encoder(sentences), torch.full((len(sentences),), 3), cfg)


def test_golden_beams_without_length_penalty():
    hyps = search([0, 1], lenpen=0.0)
    # Sentence 0: step 1 finishes "a" (0.6*0.4) in the top 2; step 2 finishes "a a" (0.6*0.5*0.7).
    assert [h.tokens for h in hyps[0]] == [[A], [A, A]]
    assert hyps[0][0].score == pytest.approx(math.log(0.24), abs=1e-6)
    assert hyps[0][1].score == pytest.approx(math.log(0.21), abs=1e-6)
    assert hyps[0][0].positional_scores == pytest.approx([math.log(0.6), math.log(0.4)], abs=1e-6)
    # Sentence 1 ends at step 0 (EOS is its best token) and keeps "a" (0.06*0.5) as the second slot.
    assert [h.tokens for h in hyps[1]] == [[], [A]]
    assert hyps[1][0].score == pytest.approx(math.log(0.9), abs=1e-6)
    assert hyps[1][1].score == pytest.approx(math.log(0.03), abs=1e-6)


def test_golden_beams_with_gnmt_length_penalty():
    hyps = search([0, 1], lenpen=1.0)
    # log(0.24) / (7/6) = -1.2233 < log(0.21) / (8/6) = -1.1705: the longer one wins now.
    assert [h.tokens for h in hyps[0]] == [[A, A], [A]]
    assert hyps[0][0].score == pytest.approx(math.log(0.21) / length_penalty(3, 1.0, "gnmt"), abs=1e-6)
    assert hyps[0][1].score == pytest.approx(math.log(0.24) / ((5 + 2) / 6), abs=1e-6)


def test_fairseq_length_penalty_and_order_independence():
    hyps = search([1, 0], lenpen=1.0, lenpen_style="fairseq")
    assert hyps[1][0].score == pytest.approx(math.log(0.21) / 3, abs=1e-6)
    assert [h.tokens for h in hyps[0]] == [[], [A]]


def test_max_length_forces_eos():
    hyps = search([0], lenpen=0.0, max_len_b=1)
    assert all(len(h.tokens) <= 1 for h in hyps[0])
    assert [h.tokens for h in hyps[0]] == [[A], [B]]


@pytest.mark.parametrize("beam", [1, 2])
def test_max_length_ends_the_output_before_min_length(beam):
    """A sentence whose max length (a*|x|+b) is under --min-len still ends there, as in greedy search;
    beam search had left every hypothesis empty with a score of -inf."""
    cfg = {"lenpen": 0.0, "max_len_a": 0.1, "max_len_b": 2, "min_len": 5, "beam": beam, "nbest": beam}  # 2 of 3
    hyps = search([0], **cfg)[0]
    assert [h.tokens for h in hyps] == [[A, A], [B, A]][:beam]
    assert hyps[0].score == pytest.approx(math.log(0.6 * 0.5 * 0.7), abs=1e-6)  # EOS's own log-prob counted
    greedy = greedy_search(
        FakeModel(), fake_encoder([0]), torch.full((1,), 3), SearchConfig(**cfg | {"beam": 1, "nbest": 1})
    )
    assert greedy[0][0].tokens == hyps[0].tokens


def test_min_length_forbids_early_eos():
    hyps = search([1], lenpen=0.0, min_len=2, nbest=1)
    assert len(hyps[0][0].tokens) >= 2


def test_top_candidates_against_numpy():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 4, generator=g)
    lp = torch.randn(12, 10, generator=g).log_softmax(-1)
    state = BeamState(torch.zeros(3, 4, 0, dtype=torch.long), scores, torch.zeros(3, 4, 0), torch.arange(3))
    top, beams, tokens = top_candidates(state.scores, lp)
    totals = (scores.numpy()[:, :, None] + lp.view(3, 4, 10).numpy()).reshape(3, 40)
    expected = np.argsort(-totals, axis=1)[:, :8]
    assert np.array_equal(beams.numpy() * 10 + tokens.numpy(), expected)
    np.testing.assert_allclose(top.numpy(), np.take_along_axis(totals, expected, 1), rtol=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_beam_one_equals_greedy(tiny_model, seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 24, (5, 6), generator=g)
    pad = torch.zeros(5, 6, dtype=torch.bool)
    pad[1, 3:] = True
    src = src.masked_fill(pad, 0)
    enc = tiny_model.encode(src, pad)
    lens = (~pad).sum(1)
    cfg = SearchConfig(beam=1, max_len_a=1.0, max_len_b=5, lenpen=0.6)
    beam = beam_search(tiny_model, enc, lens, cfg)
    greedy = greedy_search(tiny_model, enc, lens, cfg)
    for b, gr in zip(beam, greedy):
        assert b[0].tokens == gr[0].tokens
        assert b[0].score == pytest.approx(gr[0].score, abs=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_sentence_translates_the_same_alone_and_in_a_batch(tiny_model, toy_data_bin, beam):
    from nmt_cli.data.dataset import load_vocab

    translator = Translator(tiny_model, load_vocab(toy_data_bin), torch.device("cpu"))
    g = np.random.default_rng(0)
    sources = [g.integers(4, 24, n) for n in (3, 9, 1, 6, 12, 2)]
    cfg = SearchConfig(beam=beam, max_len_a=1.0, max_len_b=4, nbest=beam)
    together = translate(translator, SearchRequest(sources, cfg, 1000))
    for src, hyps in zip(sources, together):
        alone = translate(translator, SearchRequest([src], cfg, 1000))[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hyps]
        assert [h.score for h in alone] == pytest.approx([h.score for h in hyps], abs=1e-4)


def test_forced_length(tiny_model, toy_data_bin):
    from nmt_cli.data.dataset import load_vocab

    translator = Translator(tiny_model, load_vocab(toy_data_bin), torch.device("cpu"))
    cfg = SearchConfig(beam=4, min_len=7, max_len_a=0, max_len_b=7)
    for hyps in translate(translator, SearchRequest([np.array([5, 6, 7]), np.array([8])], cfg, 100)):
        assert len(hyps[0].tokens) == 7


def test_sampling_is_seeded(tiny_model, toy_data_bin):
    from nmt_cli.data.dataset import load_vocab

    translator = Translator(tiny_model, load_vocab(toy_data_bin), torch.device("cpu"))
    src = [np.array([5, 6, 7, 8])] * 4
    cfg = SearchConfig(sampling=True, sampling_topk=5, sampling_topp=0.9, temperature=1.5, beam=1, seed=3)
    a = [h[0].tokens for h in translate(translator, SearchRequest(src, cfg, 100))]
    b = [h[0].tokens for h in translate(translator, SearchRequest(src, cfg, 100))]
    assert a == b and len({tuple(x) for x in a}) > 1


@pytest.mark.parametrize("extreme", [{"temperature": 0.001}, {"sampling_topp": 1e-300}, {"temperature": 1000.0}])
def test_sampling_at_its_settings_extremes_draws_tokens(extreme):
    """The lowest temperature and top-p sample the best token (they had drawn from NaN: a 500 in serve); the highest
    temperature draws among the allowed tokens alone."""
    from nmt_cli.search.greedy import sample_from

    log_probs = torch.log_softmax(torch.randn(64, 20, generator=torch.Generator().manual_seed(0)), -1)
    log_probs[:, :3] = float("-inf")
    drawn = sample_from(log_probs, SearchConfig(sampling=True, beam=1, **extreme), torch.Generator().manual_seed(1))
    assert (drawn >= 3).all()
    if "temperature" not in extreme or extreme["temperature"] < 1:
        assert drawn.tolist() == log_probs.argmax(-1).tolist()


def test_packed_cpu_model_translates_the_same(tiny_model, toy_data_bin):
    import copy

    from nmt_cli.data.dataset import load_vocab
    from nmt_cli.model.linear import ONEDNN_AVAILABLE, pack_for_cpu_inference

    if not ONEDNN_AVAILABLE:
        pytest.skip("this torch build has no oneDNN linear op")
    packed = pack_for_cpu_inference(copy.deepcopy(tiny_model))
    g = np.random.default_rng(1)
    sources = [g.integers(4, 24, n) for n in (3, 9, 1, 6)]
    cfg = SearchConfig(beam=3, max_len_a=1.0, max_len_b=4, nbest=3)
    vocab = load_vocab(toy_data_bin)
    a = translate(Translator(tiny_model, vocab, torch.device("cpu")), SearchRequest(sources, cfg, 1000))
    b = translate(Translator(packed, vocab, torch.device("cpu")), SearchRequest(sources, cfg, 1000))
    for x, y in zip(a, b):
        assert [h.tokens for h in x] == [h.tokens for h in y]
        assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-4)


def test_bf16_packed_cpu_model_translates_as_autocast_does(trained_copy_checkpoint, toy_corpus):
    """Translation under bf16 on a CPU with bf16 instructions packs bfloat16 weights once (PackedLinear) instead
    of autocast casting every weight at every step: the same products, so the same translations."""
    from nmt_cli.model.linear import PackedLinear
    from nmt_cli.runtime import cpu_has_bf16
    from nmt_cli.search.translate import load_translator

    if not cpu_has_bf16():
        pytest.skip("this CPU has no bf16 instructions (its bf16 products are autocast's, emulated)")
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    packed, saved = load_translator(trained_copy_checkpoint, cpu, bf16)
    assert {m.dtype for m in packed.model.modules() if isinstance(m, PackedLinear)} == {bf16}
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.model.modules())
    autocast = Translator(saved.model(), saved.vocab, cpu, bf16)  # nn.Linear under autocast, as before
    lines = (toy_corpus / "test.src").read_text().splitlines()
    sources = saved.vocab.encode_arrays(lines)
    cfg = SearchConfig(beam=4, nbest=2)
    a, b = translate(autocast, SearchRequest(sources, cfg, 4000)), translate(packed, SearchRequest(sources, cfg, 4000))
    # all 30 sentences' 2 best agreed on an Intel Xeon with AMX; a rounding apart may still tip a near tie elsewhere
    assert sum([h.tokens for h in x] == [h.tokens for h in y] for x, y in zip(a, b)) >= 0.9 * len(a)
    for x, y in zip(a, b):
        if x[0].tokens == y[0].tokens:
            assert x[0].score == pytest.approx(y[0].score, abs=0.05)


@pytest.mark.parametrize("v", [8, 640, 1000, 8003, 32000])
def test_top_candidates_by_blocks_find_the_sentences_top_2k(v):
    """The block route (V of 512 pieces or more) and the direct one agree with all K*V totals."""
    b, k = 3, 4
    g = torch.Generator().manual_seed(v)
    scores = torch.randn(b, k, generator=g) * 5
    scores[0, 1:] = float("-inf")  # the first step: only beam 0 is live
    lp = torch.randn(b * k, v, generator=g).log_softmax(-1)
    lp[:, : v // 3] = float("-inf")  # masked columns, as constrain() leaves them
    lp[6, -1] = 50.0  # a sentence's best entry in the last column, ragged where V % block (sentence 1, beam 2)
    state = BeamState(torch.zeros(b, k, 0, dtype=torch.long), scores, torch.zeros(b, k, 0), torch.arange(b))
    top, beams, tokens = top_candidates(state.scores, lp)
    totals = (scores[:, :, None] + lp.view(b, k, v)).view(b, k * v)
    expected = totals.topk(2 * k, dim=1)
    assert torch.equal(top, expected.values)
    assert torch.equal(beams * v + tokens, expected.indices)
    assert (beams[1, 0], tokens[1, 0]) == (2, v - 1)


def test_candidate_block_is_the_largest_power_of_two_up_to_v_over_128():
    assert [candidate_block(v) for v in (100, 640, 8000, 8003, 32000, 37000)] == [1, 4, 32, 32, 128, 256]
