"""The well-formed-tree constraint of the search: masks log-probs so that every output is a tree.

Shapes: N rows (sentences x beams), V vocabulary.

Token classes: OPEN `(LABEL`, CLOSE `)`, LEAF (a POS tag or XX), EOS, OTHER (never allowed). A row's
state is its open-bracket depth, its leaves still to place, whether the root was opened and how many
opening brackets came in a row just before. With t tokens emitted and at most M before EOS, a token is allowed
only if the tree can still be finished in time (each leaf and each open bracket needs one more token):

    OPEN   leaves_left >= 1, (depth >= 1 or root not opened), t + 1 + leaves_left + depth + 1 <= M,
           fewer than MAX_OPEN_RUN opening brackets in a row before it
    LEAF   depth >= 1, leaves_left >= 1,                      t + 1 + leaves_left - 1 + depth <= M
    CLOSE  depth >= 1, last token not OPEN (no empty constituent), depth >= 2 or leaves_left == 0
    EOS    root opened and depth == 0 (so every leaf is placed)

MAX_OPEN_RUN (8) bounds chains like `(S (S (NP (NP ...` (the treebank opens at most 6 in a row), which an
undertrained model's search could otherwise fill its length budget with. If M >= |x| + 2 at the start, some token
is always allowed, and at t = M only EOS is: no malformed tree, nor one with another number of leaves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.data.vocab import EOS
from nmt_cli.parsing.linearize import CLOSE, is_open

OTHER, OPEN, CLOSE_CLASS, LEAF, END = 0, 1, 2, 3, 4
MAX_OPEN_RUN = 8
NEG_INF = float("-inf")


@dataclass
class TreeState:
    depth: Tensor  # [N] open brackets
    leaves_left: Tensor  # [N] words still to place
    started: Tensor  # [N] bool, the root bracket was opened
    open_run: Tensor  # [N] opening brackets in a row just before (0: the last token was no opening bracket)

    @property
    def last_open(self) -> Tensor:
        return self.open_run > 0

    def select(self, rows: Tensor) -> TreeState:
        """Reorder or subset rows [N'] (beams reordered, finished sentences removed)."""
        return TreeState(self.depth[rows], self.leaves_left[rows], self.started[rows], self.open_run[rows])


class TreeConstraint:
    """Token classes of a vocabulary; `mask` and `advance` work on any number of rows at once."""

    rank_candidates = None  # beam search takes the best candidates by score

    def __init__(self, token_class: Tensor) -> None:
        self.token_class = token_class  # [V] long: OTHER, OPEN, CLOSE_CLASS, LEAF or END

    @classmethod
    def from_pieces(cls, pieces: Sequence[str], leaf_tokens: Sequence[str], vocab_size: int) -> TreeConstraint:
        """Classes from the tree token of every id (id order; anything else, e.g. "" for a text piece, is
        OTHER); rows beyond them (padding) are OTHER."""
        leaves = set(leaf_tokens)
        token_class = torch.full((vocab_size,), OTHER, dtype=torch.long)
        for i, piece in enumerate(pieces):
            if is_open(piece):
                token_class[i] = OPEN
            elif piece == CLOSE:
                token_class[i] = CLOSE_CLASS
            elif piece in leaves:
                token_class[i] = LEAF
        token_class[EOS] = END
        return cls(token_class)

    def start(self, n_leaves: Tensor) -> TreeState:
        """The state before the first token, one row per entry of n_leaves [N]."""
        zeros = torch.zeros_like(n_leaves)
        return TreeState(zeros, n_leaves.clone(), zeros.bool(), zeros.clone())

    def allowed(self, state: TreeState, step: int, max_len: Tensor) -> Tensor:
        """[N, V] True where a token keeps the row completable; max_len [N] tokens allowed before EOS."""
        d, left = state.depth, state.leaves_left
        room = max_len - (step + 1)  # tokens that may follow the one chosen now
        by_class = torch.stack(
            [
                torch.zeros_like(state.started),
                (left >= 1) & ((d >= 1) | ~state.started) & (left + d + 1 <= room) & (state.open_run < MAX_OPEN_RUN),
                (d >= 1) & ~state.last_open & ((d >= 2) | (left == 0)),
                (d >= 1) & (left >= 1) & (left - 1 + d <= room),
                state.started & (d == 0),
            ],
            dim=1,
        )  # [N, 5]
        return by_class[:, self.token_class.to(d.device)]  # [N, V]

    def mask(self, log_probs: Tensor, state: TreeState, step: int, max_len: Tensor) -> Tensor:
        """log_probs [N, V] with every token that would break the tree set to -inf."""
        return log_probs.masked_fill(~self.allowed(state, step, max_len), NEG_INF)

    def advance(self, state: TreeState, tokens: Tensor) -> TreeState:
        """The state after each row emitted tokens [N] (EOS and padding leave it unchanged)."""
        cls = self.token_class.to(tokens.device)[tokens]
        opened, closed = cls == OPEN, cls == CLOSE_CLASS
        return TreeState(
            state.depth + opened.long() - closed.long(),
            state.leaves_left - (cls == LEAF).long(),
            state.started | opened,
            (state.open_run + 1) * opened.long(),
        )
