"""The tree constraint on plain tensors, and constrained search on a tiny random model."""

import random

import pytest
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import EOS
from nmt_cli.parsing.constraint import TreeConstraint
from nmt_cli.parsing.linearize import delinearize
from nmt_cli.search.beam import beam_search
from nmt_cli.search.greedy import greedy_search

# ids 0-3 specials, then: 4 "(S", 5 "(NP", 6 ")", 7 "XX", 8 "NN", 9-11 other pieces
PIECES = ["<pad>", "<unk>", "<s>", "</s>", "(S", "(NP", ")", "XX", "NN", "▁a", "▁b", "c"]
V = 16  # padded


@pytest.fixture
def constraint():
    return TreeConstraint.from_pieces(PIECES, ["XX", "NN"], V)


def allowed_ids(constraint, state, step, max_len):
    return set(constraint.allowed(state, step, torch.tensor([max_len])).nonzero()[:, 1].tolist())


def run(constraint, tokens, n_leaves):
    state = constraint.start(torch.tensor([n_leaves]))
    for tok in tokens:
        state = constraint.advance(state, torch.tensor([tok]))
    return state


def test_first_token_must_open_the_root(constraint):
    assert allowed_ids(constraint, run(constraint, [], 2), 0, 10) == {4, 5}


def test_no_close_right_after_open_and_no_early_root_close(constraint):
    state = run(constraint, [4], 2)  # (S
    assert allowed_ids(constraint, state, 1, 10) == {4, 5, 7, 8}
    state = run(constraint, [4, 7], 2)  # (S XX : one leaf left, so the root may not close
    assert allowed_ids(constraint, state, 2, 10) == {4, 5, 7, 8}
    state = run(constraint, [4, 5, 7], 2)  # (S (NP XX : the NP may close
    assert 6 in allowed_ids(constraint, state, 3, 10)


def test_exact_leaf_count_then_only_close_then_only_eos(constraint):
    state = run(constraint, [4, 7, 8], 2)  # (S XX NN : all leaves placed
    assert allowed_ids(constraint, state, 3, 10) == {6}
    state = run(constraint, [4, 7, 8, 6], 2)
    assert allowed_ids(constraint, state, 4, 10) == {EOS}


def test_budget_forces_leaves_and_closing(constraint):
    # (S (NP : 2 leaves and 2 closings left = 4 tokens; with exactly 4 steps of room no bracket may open
    state = run(constraint, [4, 5], 2)
    assert allowed_ids(constraint, state, 2, 6) == {7, 8}
    state = run(constraint, [4, 5, 7], 2)  # 1 leaf + 2 closings left, room 3 after step 3 at max_len 6
    assert allowed_ids(constraint, state, 3, 6) == {6, 7, 8}
    state = run(constraint, [4, 5, 7, 8], 2)
    assert allowed_ids(constraint, state, 4, 6) == {6}


def test_mask_sets_disallowed_to_minus_inf_and_keeps_the_rest(constraint):
    log_probs = torch.randn(2, V)
    state = constraint.start(torch.tensor([1, 3]))
    state = constraint.advance(state, torch.tensor([4, 4]))
    masked = constraint.mask(log_probs.clone(), state, 1, torch.tensor([20, 20]))
    assert torch.isinf(masked[:, [0, 1, 2, 3, 6, 9, 10, 11, 12]]).all()
    assert torch.equal(masked[:, [4, 5, 7, 8]], log_probs[:, [4, 5, 7, 8]])


@pytest.mark.parametrize("seed", range(20))
def test_random_walks_always_give_trees(constraint, seed):
    """Any path through the allowed tokens is a tree with exactly n leaves, finished by max_len."""
    rng = random.Random(seed)
    n, max_len = rng.randint(1, 6), rng.randint(8, 20)
    state, tokens = constraint.start(torch.tensor([n])), []
    for step in range(max_len + 1):
        choices = sorted(allowed_ids(constraint, state, step, max_len))
        assert choices, "a reachable state must always allow some token"
        if step == max_len:
            assert choices == [EOS]
        tok = rng.choice(choices)
        if tok == EOS:
            break
        tokens.append(tok)
        state = constraint.advance(state, torch.tensor([tok]))
    tree = delinearize([PIECES[t] for t in tokens], [f"w{i}" for i in range(n)])
    assert len(tree.words()) == n


@pytest.mark.parametrize("beam", [1, 3])
def test_constrained_search_on_a_random_model_gives_trees(tiny_model, beam):
    constraint = TreeConstraint.from_pieces(PIECES + [f"p{i}" for i in range(12)], ["XX", "NN"], 24)
    torch.manual_seed(1)
    src = torch.randint(4, 24, (5, 7))
    src[:, -1] = EOS
    n_leaves = torch.tensor([1, 2, 3, 5, 6])
    enc = tiny_model.encode(src, src.eq(0))
    cfg = SearchConfig(beam=beam, lenpen=0.3, max_len_a=1.0, max_len_b=8)
    src_lens = torch.full((5,), 6)
    if beam == 1:
        hyps = greedy_search(tiny_model, enc, src_lens, cfg, rules=(constraint, n_leaves))
    else:
        hyps = beam_search(tiny_model, enc, src_lens, cfg, rules=(constraint, n_leaves))
    for n, h in zip(n_leaves.tolist(), hyps):
        tree = delinearize([PIECES[t] for t in h[0].tokens], [f"w{i}" for i in range(n)])
        assert tree.words() == [f"w{i}" for i in range(n)]
        assert len(h[0].tokens) <= 6 + 8


def test_opening_brackets_in_a_row_are_bounded(constraint):
    """An undertrained model filled the length budget with (NP (NP (NP ... chains."""
    from nmt_cli.parsing.constraint import MAX_OPEN_RUN

    state = run(constraint, [4] + [5] * (MAX_OPEN_RUN - 1), 2)
    assert allowed_ids(constraint, state, MAX_OPEN_RUN, 100) == {7, 8}
    state = run(constraint, [4] + [5] * (MAX_OPEN_RUN - 1) + [7], 2)  # a leaf ends the run
    assert {4, 5} <= allowed_ids(constraint, state, MAX_OPEN_RUN + 1, 100)
