"""Work done one step per resumption: a generator that yields after each step and returns its result. The
encoder runs a layer per resumption (`Transformer.encode_steps`), a search a decoder step (search/beam.py), so
that serve's worker can interleave several batches; `run_to_end` drives one to its end."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import ParamSpec, TypeVar

R = TypeVar("R")
P = ParamSpec("P")
# One step per resumption, then the result.
Steps = Generator[None, None, R]


def run_to_end(steps: Steps[R]) -> R:
    """Run stepped work to its end; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def to_the_end(stepping: Callable[P, Steps[R]]) -> Callable[P, R]:
    """A stepping function (`beam_steps`, ...) as one that runs it to its end (`beam_search`, ...): the same
    arguments, its result."""

    def whole(*args: P.args, **kwargs: P.kwargs) -> R:
        return run_to_end(stepping(*args, **kwargs))

    whole.__doc__ = f"`{stepping.__name__}` run to its end, with its arguments: its results."
    return whole
