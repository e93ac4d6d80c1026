"""The queue's records (serve/batcher.py): a request's Job, its sentences Queued, a Running batch's search, and
how their results reach the requests' Futures (early answers included)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

# (item's index, its result): an item's result given as soon as the search has it, before the batch ends
Answer = Callable[[int, Any], None]


@dataclass(eq=False)
class Job:
    """One request's sentences (`items`, searched with the settings `key`) and the Future of their results."""

    key: Hashable
    items: Sequence[Any]
    future: Future[list[Any]] = field(default_factory=Future)
    results: list[Any] = field(default_factory=list)
    remaining: int = 0
    arrived: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Queued:
    job: Job
    index: int
    length: int  # source pieces, for the token budget; 0: an empty sentence (no search)
    bound: float = math.inf  # the most steps its search may take (StepsBound; inf: unknown)
    answered: bool = False
    start_step: int = 0  # the step of its batch it started at (0, or the step an in-flight batch admitted it)

    def answer(self, result: Any) -> None:
        """Record this sentence's result (once: an early answer is not given again at the batch's end); the request
        is answered with its last sentence's."""
        if self.answered:
            return
        self.answered = True
        self.job.results[self.index] = result
        self.job.remaining -= 1
        if self.job.remaining == 0:
            settle(self.job.future, result=self.job.results)


@dataclass(eq=False)
class Running:
    """A batch whose search has started: its sentences, its search, and the steps (and seconds) it has had."""

    batch: list[Queued]
    search: Generator[None, None, list[Any]]
    steps: int = 0
    seconds: float = 0.0
    arrived_at_early: int | None = None  # the batcher's sentences arrived when this batch first answered a request
    free: int = 0  # in flight: the slots its search left free when it last took sentences (Admission.take)
    fits: Callable[[Any], bool] | None = None  # in flight: which items its search takes, as it last said

    @property
    def left(self) -> float:
        """The most steps it may still take (inf: unknown)."""
        return max((q.bound + q.start_step for q in self.batch), default=0) - self.steps


@dataclass
class Admission:
    """What an in-flight batch's search may ask of the queue between two steps: `take(free, fits)` removes and
    returns the items of at most `free` queued sentences of the batch's key for which `fits(item)` holds (they join
    the batch, answered as its own); `capacity`: the sentences the batcher expects to search at once."""

    take: Callable[[int, Callable[[Any], bool]], list[Any]]
    capacity: int


def admitting(admission: Admission, sentences: list[Any]) -> Callable[[int, int], list[Any]]:
    """search/in_flight.py's InFlight.admit over serve's queue: (free slots, longest source) -> the token ids of the
    sentences taken, those of no rule of their own (prefix, constraints, alignment) and 1 to `longest` pieces;
    they are appended to `sentences` (serve's Sentence records of the batch), whose results follow its own."""

    def admit(free: int, longest: int) -> list[Any]:
        def fits(s: Any) -> bool:
            return s.prefix is None and not s.phrases and s.alignment is None and 0 < len(s.ids) <= longest

        taken = admission.take(free, fits)
        sentences.extend(taken)
        return [s.ids for s in taken]

    return admit


def takes(running: Running, q: Queued, free_slot: bool = True) -> bool:
    """Whether an in-flight batch would take the queued sentence q at its next step: of its key, a free slot left
    (unless not `free_slot`: once one is), and one its search said it takes."""
    fits = running.fits
    same = running.batch[0].job.key == q.job.key
    room = running.free > 0 or not free_slot
    return same and room and fits is not None and q.length > 0 and fits(q.job.items[q.index])


def stranded(queue: list[Queued], running: list[Running], max_running: int) -> bool:
    """Whether the oldest queued sentence can start nowhere while the running batches go on: as many run as may,
    and none of them would take it even once a slot is free. In-flight batches then take no more, so that one ends
    and it starts (under steady load they would run forever)."""
    if not queue or len(running) < max_running:
        return False
    return not any(takes(r, queue[0], free_slot=False) for r in running)


def jobs_of(batch: list[Queued]) -> list[Job]:
    """The requests a batch's sentences belong to, each once."""
    return list({id(q.job): q.job for q in batch}.values())


def still_waiting(futures: list[Future[list[Any]]]) -> list[bool]:
    """Per sentence, whether its request still waits for it: not answered, timed out, cancelled, or gone."""
    return [not f.done() for f in futures]


def settle(future: Future[list[Any]], result: list[Any] | None = None, exception: Exception | None = None) -> None:
    """Set a Future's outcome unless it was cancelled meanwhile (its request timed out or went away)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result if result is not None else [])
    except InvalidStateError:
        pass
