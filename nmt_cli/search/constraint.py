"""What a constrained search follows step by step: the interface parsing's tree constraints implement
(parsing/constraint.py, parsing/copy_constraint.py) and beam and greedy search call. Shapes: N rows (sentences x
beams), V vocabulary."""

from __future__ import annotations

from typing import Protocol, TypeVar

from torch import Tensor

State = TypeVar("State", bound="ConstraintState")


class ConstraintState(Protocol):
    """The constraint's per-row state; the search reorders it with its beams."""

    def select(self: State, rows: Tensor) -> State: ...


class StepConstraint(Protocol[State]):
    def start(self, n_leaves: Tensor) -> State:
        """The state before the first token, for rows of n_leaves [N] leaves each."""
        ...

    def mask(self, log_probs: Tensor, state: State, step: int, max_len: Tensor) -> Tensor:
        """log_probs [N, V] with the tokens the rules forbid at this step set to -inf."""
        ...

    def advance(self, state: State, tokens: Tensor) -> State:
        """The state after each row's chosen token [N]."""
        ...
