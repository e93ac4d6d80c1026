"""Constrained search, one idea in two parts: the `Constraint` that beam and greedy search follow step by step,
and the `ConstraintSource` that gives the search driver (translate.py) each batch's Constraint. parsing/'s tree
constraints implement both (parsing/constraint.py, parsing/copy_constraint.py, parsing/parser.py), as do a target
prefix (prefix.py) and the ban of repeated n-grams (ngram.py); `all_of` composes several into one. Shapes: N
rows (sentences x beams, sentence-major), V vocabulary, B sentences of a batch, S source positions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

State = TypeVar("State", bound="ConstraintState")
Candidates = tuple[Tensor, Tensor, Tensor]  # scores, beams, tokens [B, C]: a beam search step's candidates
# (the constraint's state, beam scores [B, K], log-probs [B*K, V], the top 2K candidates) -> the candidates [B, C] in
# the order the beam takes them: EOS ones among the first K finish, the first K others survive (search/beam.py)
Ranker = Callable[[Any, Tensor, Tensor, Candidates], Candidates]


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

    @property
    def rank_candidates(self) -> Ranker | None:
        """Beam search's choice and order of each step's candidates (lexical constraints' beam allocation), or
        None: the best by score."""
        ...


Followed = tuple[Constraint[Any], Tensor]  # a batch's constraint and each sentence's n_leaves [B] (`for_batch`)


class ConstraintSource(Protocol):
    """What a constrained search asks of its caller for each batch: the Constraint to follow and each sentence's
    number of leaves [B] (the length the constraint aims at; a constraint that aims at no length ignores it). The
    search hands it to the Constraint's `start` once per row (N = B*K, sentence-major).

    src: [B, S] the batch's padded sources on the device (EOS included); src_lens: [B] their lengths without EOS,
    on the host; ids: [B] the batch's sentences as indices into the `sources` given to `translate`."""

    def for_batch(self, src: Tensor, src_lens: Tensor, ids: np.ndarray) -> Followed: ...


class ConstraintsState:
    """The states of a Constraints' parts, one per part, reordered together."""

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self.parts = parts

    def select(self, rows: Tensor) -> ConstraintsState:
        return ConstraintsState(tuple(state.select(rows) for state in self.parts))


class Constraints:
    """Several constraints followed at once: each masks in turn (in the order given) and follows the same tokens.

    start receives each row's sentence (an index into the batch, which `AllOf.for_batch` gives as its n_leaves)
    and starts each part with its own per-sentence n_leaves for those rows."""

    def __init__(self, parts: Sequence[Constraint[Any]], n_leaves: Sequence[Tensor]) -> None:
        self.parts, self.n_leaves = tuple(parts), tuple(n_leaves)
        # The one part that ranks the beam's candidates ranks them, on its own state; a second could not share it.
        rankers = [(i, part.rank_candidates) for i, part in enumerate(self.parts) if part.rank_candidates is not None]
        assert len(rankers) <= 1, "one constraint at most chooses the beam's candidates"
        self.rank_candidates: Ranker | None = None
        if rankers:
            (i, rank), *_ = rankers
            self.rank_candidates = lambda state, *args: rank(state.parts[i], *args)

    def start(self, n_leaves: Tensor) -> ConstraintsState:
        rows = n_leaves  # [N] each row's sentence in the batch
        return ConstraintsState(
            tuple(part.start(leaves.to(rows.device)[rows]) for part, leaves in zip(self.parts, self.n_leaves))
        )

    def mask(self, log_probs: Tensor, state: ConstraintsState, step: int, max_len: Tensor) -> Tensor:
        for part, part_state in zip(self.parts, state.parts):
            log_probs = part.mask(log_probs, part_state, step, max_len)
        return log_probs

    def advance(self, state: ConstraintsState, tokens: Tensor) -> ConstraintsState:
        return ConstraintsState(tuple(part.advance(s, tokens) for part, s in zip(self.parts, state.parts)))


class AllOf:
    """A ConstraintSource whose batches follow every one of its sources' constraints (`Constraints`)."""

    def __init__(self, sources: Sequence[ConstraintSource]) -> None:
        self.sources = tuple(sources)

    def for_batch(self, src: Tensor, src_lens: Tensor, ids: np.ndarray) -> tuple[Constraints, Tensor]:
        parts, n_leaves = zip(*(source.for_batch(src, src_lens, ids) for source in self.sources))
        return Constraints(parts, n_leaves), torch.arange(len(ids), device=src.device)


def all_of(*sources: ConstraintSource | None) -> ConstraintSource | None:
    """The sources given (None: no rules) composed into one: None when none is given, the source itself when one
    is (a parser's tree alone searches exactly as before), else an `AllOf` of them, in order."""
    given = [source for source in sources if source is not None]
    if not given:
        return None
    return given[0] if len(given) == 1 else AllOf(given)
