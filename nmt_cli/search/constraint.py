"""Constrained search, one idea in two parts: the `Constraint` that beam and greedy search follow step by step,
and the `ConstraintSource` that gives the search driver (translate.py) each batch's Constraint. parsing/'s tree
constraints implement both (parsing/constraint.py, parsing/copy_constraint.py, parsing/parser.py). Shapes: N
rows (sentences x beams), V vocabulary, B sentences of a batch, S source positions."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import numpy as np
from torch import Tensor

State = TypeVar("State", bound="ConstraintState")


class ConstraintState(Protocol):
    """The constraint's per-row state; the search reorders it with its beams."""

    def select(self: State, rows: Tensor) -> State: ...


class Constraint(Protocol[State]):
    """Rules a search follows token by token, over a per-row state it reorders with its beams."""

    def start(self, n_leaves: Tensor) -> State:
        """The state before the first token, for rows of n_leaves [N] leaves each."""
        ...

    def mask(self, log_probs: Tensor, state: State, step: int, max_len: Tensor) -> Tensor:
        """log_probs [N, V] with the tokens the rules forbid at this step set to -inf."""
        ...

    def advance(self, state: State, tokens: Tensor) -> State:
        """The state after each row's chosen token [N]."""
        ...


class ConstraintSource(Protocol):
    """What a constrained search asks of its caller for each batch: the Constraint to follow and each sentence's
    number of leaves [B] (the length the constraint aims at).

    src: [B, S] the batch's padded sources on the device (EOS included); src_lens: [B] their lengths without EOS,
    on the host; ids: [B] the batch's sentences as indices into the `sources` given to `translate`."""

    def for_batch(self, src: Tensor, src_lens: Tensor, ids: np.ndarray) -> tuple[Constraint[Any], Tensor]: ...
