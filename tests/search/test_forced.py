"""Teacher-forced scoring and alignments (search/forced.py): a search's own hypotheses score their search scores,
and alignments give one source piece per target token within the source."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from nmt_cli.data.vocab import BOS, EOS, PAD, UNK
from nmt_cli.errors import ConfigError
from nmt_cli.model.transformer import AttentionWeights
from nmt_cli.search.forced import add_alignments, alignment_layer, forced_scores, pair_batches
from nmt_cli.search.translate import SearchRequest, load_translator, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

TOLERANCE = 1e-4  # float32 sums of the same log-probs, computed step by step and in one pass


@pytest.fixture(scope="module")
def opened(tiny_checkpoint):
    return load_translator(tiny_checkpoint, torch.device("cpu"), None)


def random_sources(translator, n, seed):
    rng = np.random.default_rng(seed)
    lines = [" ".join(str(d) for d in rng.integers(0, 10, rng.integers(1, 12))) for _ in range(n)]
    return translator.vocab.encode_arrays(lines)


@pytest.mark.parametrize("style", ["gnmt", "fairseq"])
@pytest.mark.parametrize("unkpen", [0.0, -4.0])  # a negative penalty makes the tiny model write unknown pieces
def test_search_hypotheses_score_their_search_scores(opened, style, unkpen):
    translator, saved = opened
    search = replace(saved.search, beam=4, nbest=4, lenpen=1.3, lenpen_style=style, unkpen=unkpen, max_len_b=8)
    sources = random_sources(translator, 36, seed=1)
    results = translate(translator, SearchRequest(sources, search, 64))
    pairs = [(s, h) for s, hyps in zip(sources, results) for h in hyps]
    scored = forced_scores(translator, [s for s, _ in pairs], [np.array(h.tokens) for _, h in pairs], search, 64)
    assert len(scored) == len(pairs) == 36 * 4
    for (_, h), p in zip(pairs, scored):
        assert p.tokens == h.tokens
        assert p.score == pytest.approx(h.score, abs=TOLERANCE)
        assert p.log_prob == pytest.approx(sum(p.token_scores), abs=1e-9)
        unknown = [i for i, t in enumerate(h.tokens) if t == UNK]
        expected = [s + unkpen * (i in unknown) for i, s in enumerate(h.positional_scores)]
        assert p.token_scores == pytest.approx(expected, abs=TOLERANCE)
    n_unknown = sum(UNK in h.tokens for _, h in pairs)
    assert (n_unknown > 0) == (unkpen != 0)  # the penalty is exercised, and absent without it


def test_scores_do_not_depend_on_the_batch(opened):
    translator, saved = opened
    sources = random_sources(translator, 12, seed=2)
    targets = random_sources(translator, 12, seed=3)
    together = forced_scores(translator, sources, targets, saved.search, max_tokens=1000)
    alone = [forced_scores(translator, [s], [t], saved.search, max_tokens=1)[0] for s, t in zip(sources, targets)]
    for a, b in zip(together, alone):
        assert a.token_scores == pytest.approx(b.token_scores, abs=1e-5)
        assert len(a.token_scores) == len(a.tokens) + 1


def test_long_targets_are_cut_to_the_model_positions(opened, caplog):
    translator, saved = opened
    limit = translator.model.max_positions - 1
    target = np.full(limit + 10, 5, dtype=np.int64)
    (scored,) = forced_scores(translator, [np.array([5, 6])], [target], saved.search, max_tokens=8)
    assert len(scored.tokens) == limit and len(scored.token_scores) == limit + 1
    assert "1 target(s) longer than the model's" in caplog.text


@pytest.mark.parametrize("hard", [True, False])
def test_alignments_one_source_piece_per_target_token(opened, hard):
    translator, saved = opened
    search = replace(saved.search, beam=3, nbest=2, max_len_b=6)
    sources = random_sources(translator, 20, seed=4) + [np.zeros(0, dtype=np.int64)]
    results = translate(translator, SearchRequest(sources, search, 64))
    add_alignments(translator, sources, results, hard=hard, layer=0, max_tokens=64)
    for src, hyps in zip(sources, results):
        for h in hyps:
            a = h.alignment
            assert a is not None and a.weights.shape == (len(h.tokens), len(src))
            if len(h.tokens):
                assert np.allclose(a.weights.sum(1), 1.0, atol=1e-5)
            pairs = a.pairs()
            assert [t for _, t in pairs] == list(range(len(h.tokens)))
            assert all(0 <= s < len(src) for s, _ in pairs)
            if hard:
                assert a.text() == " ".join(f"{s}-{t}" for s, t in pairs)
                assert a.record() == a.text()
            else:
                rows = a.record()
                assert len(rows) == len(h.tokens) and all(len(r) == len(src) for r in rows)
                assert all(abs(sum(r) - 1) < 1e-3 for r in rows)


def test_alignment_is_the_layer_attention_of_the_model_alone(opened):
    """Batched with others, a hypothesis gets exactly the head-averaged attention of its own teacher-forced pass."""
    translator, saved = opened
    model = translator.model
    sources = random_sources(translator, 8, seed=5)
    results = translate(translator, SearchRequest(sources, replace(saved.search, beam=2, max_len_b=6), 64))
    add_alignments(translator, sources, results, hard=True, layer=1, max_tokens=64)
    for src, (h,) in zip(sources, results):
        if not h.tokens:
            continue
        weights = AttentionWeights()
        with torch.inference_mode():
            src_t = torch.tensor([*src.tolist(), EOS])[None]
            model(src_t, src_t.eq(PAD), torch.tensor([[BOS, *h.tokens]]), weights)
        expected = weights.cross[1][0].mean(0)[: len(h.tokens), : len(src)].numpy()
        expected = expected / expected.sum(1, keepdims=True)
        assert np.allclose(h.alignment.weights, expected, atol=1e-5)
        assert [s for s, _ in h.alignment.pairs()] == expected.argmax(1).tolist()


def test_alignment_layer_default_and_bounds():
    assert alignment_layer(None, 6) == 4 and alignment_layer(None, 1) == 0 and alignment_layer(2, 3) == 2
    with pytest.raises(ConfigError, match=r"--alignment-layer 3: the checkpoint's decoder has 3 layers \(0 to 2\)"):
        alignment_layer(3, 3)


def test_pair_batches_hold_every_pair_once_within_budget_and_little_padding():
    rng = np.random.default_rng(6)
    src_lens, tgt_lens = rng.integers(0, 60, 500), rng.integers(0, 90, 500)
    batches = pair_batches(src_lens, tgt_lens, max_tokens=600, batch_size=40)
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    for batch in batches:
        tgt = tgt_lens[batch]
        assert (
            len(batch) <= 40 and len(batch) * (tgt.max() + 1) <= 600 and len(batch) * (src_lens[batch].max() + 1) <= 600
        )
        assert tgt.max() <= tgt.min() * 5 // 4 + 2
    assert pair_batches(np.array([700]), np.array([3]), max_tokens=600, batch_size=0)[0].tolist() == [0]
