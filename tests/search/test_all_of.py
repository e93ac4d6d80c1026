"""constraint.all_of: None parts dropped, one part returned as it is (a parser's tree searches as before), several
started with their own per-sentence values for each row, masking in order and following the same tokens."""

import numpy as np
import pytest
import torch

from nmt_cli.search.beam import per_beam
from nmt_cli.search.constraint import AllOf, all_of
from nmt_cli.search.ngram import NoRepeatNgram

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


class Rows:
    def __init__(self, values):
        self.values = values

    def select(self, rows):
        return Rows(self.values[rows])


class Recording:
    """A ConstraintSource and Constraint that bans one token and records what it is given."""

    rank_candidates = None

    def __init__(self, n_leaves, banned):
        self.n_leaves, self.banned, self.started, self.advanced = n_leaves, banned, None, []

    def for_batch(self, src, src_lens, ids):
        return self, self.n_leaves[ids]

    def start(self, n_leaves):
        self.started = n_leaves
        return Rows(n_leaves)

    def mask(self, log_probs, state, step, max_len):
        out = log_probs.clone()
        out[:, self.banned] = float("-inf")
        return out

    def advance(self, state, tokens):
        self.advanced.append(tokens)
        return state


def test_none_and_one():
    one = Recording(torch.tensor([1]), 4)
    assert all_of() is None and all_of(None, None) is None
    assert all_of(None, one) is one and all_of(one) is one
    assert isinstance(all_of(one, None, NoRepeatNgram(2)), AllOf)


def test_parts_start_with_their_own_values_mask_in_order_and_follow_the_tokens():
    a, b = Recording(torch.tensor([10, 20, 30, 40]), 4), Recording(torch.tensor([7, 8, 9, 6]), 5)
    ids = np.array([2, 0, 1])  # the batch's sentences among the sources
    constraint, rows = all_of(a, b).for_batch(torch.zeros(3, 2, dtype=torch.long), torch.tensor([1, 1, 1]), ids)
    state = constraint.start(per_beam(rows, 2))  # two beams a sentence, sentence-major
    assert a.started.tolist() == [30, 30, 10, 10, 20, 20] and b.started.tolist() == [9, 9, 7, 7, 8, 8]
    masked = constraint.mask(torch.zeros(6, 7), state, 0, torch.full((6,), 9))
    assert masked.isinf().nonzero()[:, 1].unique().tolist() == [4, 5]
    state = constraint.advance(state.select(torch.tensor([1, 0, 2, 2, 5, 4])), torch.arange(6))
    assert [p.values.tolist() for p in state.parts] == [[30, 30, 10, 10, 20, 20], [9, 9, 7, 7, 8, 8]]
    assert a.advanced[0].tolist() == b.advanced[0].tolist() == list(range(6))
