"""--no-repeat-ngram-size N: no output of beam search, greedy search or sampling repeats an n-gram of N pieces (a
tiny random model repeats a lot); 0 searches exactly as before; the ban's mask against a plain Python one."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.dataset import load_vocab
from nmt_cli.data.vocab import EOS
from nmt_cli.errors import ConfigError
from nmt_cli.search.ngram import NoRepeatNgram, no_repeat_ngrams, repeated_ngram
from nmt_cli.search.settings import search_settings
from nmt_cli.search.translate import SearchRequest, Translator, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

SETTINGS = {
    "beam": dict(beam=4, nbest=4),
    "greedy": dict(beam=1),
    "sampling": dict(sampling=True, beam=1, temperature=1.5, seed=5),
    "sampling-nbest": dict(sampling=True, beam=1, nbest=3, seed=7),
}


def random_sources(n, seed=0):
    g = np.random.default_rng(seed)
    return [g.integers(4, 24, int(m)) for m in g.integers(1, 12, n)]


@pytest.fixture
def translator(tiny_model, toy_data_bin):
    return Translator(tiny_model, load_vocab(toy_data_bin), torch.device("cpu"))


@pytest.mark.parametrize("how, size", [("beam", 2), ("greedy", 1), ("sampling", 3), ("sampling-nbest", 2)])
def test_no_output_repeats_an_ngram(translator, how, size):
    sources = random_sources(100, seed=size)
    base = SearchConfig(max_len_a=1.5, max_len_b=12, **SETTINGS[how])
    plain = translate(translator, SearchRequest(sources, base, 2000))
    assert any(repeated_ngram(h.tokens, size) for hyps in plain for h in hyps)  # the model does repeat
    cfg = SearchConfig(max_len_a=1.5, max_len_b=12, no_repeat_ngram_size=size, **SETTINGS[how])
    results = translate(translator, SearchRequest(sources, cfg, 2000))
    for hyps in results:
        assert len(hyps) == cfg.nbest
        for h in hyps:
            assert repeated_ngram(h.tokens, size) is None, h.tokens
            assert np.isfinite(h.score) and len(h.positional_scores) == len(h.tokens) + 1


@pytest.mark.parametrize("how", SETTINGS)
def test_a_ban_that_bans_nothing_searches_as_before(translator, how):
    """Size 0 adds no constraint at all; a size longer than any output runs the ban's masks, which ban nothing,
    and the results are bit-identical to the search without it."""
    assert no_repeat_ngrams(SearchConfig()) is None
    sources = random_sources(20)
    cfg = SearchConfig(max_len_a=1.5, max_len_b=12, **SETTINGS[how])
    a = translate(translator, SearchRequest(sources, cfg, 2000))
    b = translate(translator, SearchRequest(sources, replace(cfg, no_repeat_ngram_size=40), 2000))
    assert [[(h.tokens, h.score, h.positional_scores) for h in hyps] for hyps in a] == [
        [(h.tokens, h.score, h.positional_scores) for h in hyps] for hyps in b
    ]


def python_ban(tokens, size):
    """The tokens that would complete an n-gram already in `tokens`: the rule written plainly."""
    if len(tokens) < size:
        return set()
    last = tuple(tokens[len(tokens) - size + 1 :])
    return {
        tokens[i + size - 1]
        for i in range(len(tokens) - size + 1)
        if tuple(tokens[i : i + size - 1]) == last and tokens[i + size - 1] != EOS
    }


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_mask_bans_what_the_rule_says(size):
    g = torch.Generator().manual_seed(size)
    tokens = torch.randint(3, 8, (50, 12), generator=g)  # few tokens: many repeats; EOS (3) among them
    ban = NoRepeatNgram(size)
    state = ban.start(torch.zeros(50, dtype=torch.long))
    for t in range(tokens.shape[1]):
        masked = ban.mask(torch.zeros(50, 9), state, t, torch.full((50,), 100))
        for row in range(50):
            want = python_ban(tokens[row, :t].tolist(), size)
            assert {int(i) for i in torch.nonzero(masked[row].isinf()).view(-1)} == want
        state = ban.advance(state.select(torch.arange(50)), tokens[:, t])


def test_a_parser_refuses_it():
    cfg = SearchConfig()
    with pytest.raises(ConfigError, match="parsing model.*--no-repeat-ngram-size 3"):
        search_settings("p.pt", cfg, {"no_repeat_ngram_size": 3}, True, None)
