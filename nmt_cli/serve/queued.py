"""The queue's records (serve/batcher.py): a request's Job, its sentences Queued, a Running batch's search, and
how their results reach the requests' Futures (early answers included)."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """The queue has no room for the request's sentences (HTTP 503)."""


class Stopping(Exception):
    """The server is shutting down and takes no new requests (HTTP 503)."""


# (item's index, its result): an item's result given as soon as the search has it, before the batch ends
Answer = Callable[[int, Any], None]


@dataclass(eq=False)
class Job:
    """One request's sentences (`items`, searched with the settings `key`) of a `client` (None: a client of its own,
    the Job itself) and the Future of their results."""

    key: Hashable
    items: Sequence[Any]
    client: Hashable = None
    future: Future[list[Any]] = field(default_factory=Future)
    results: list[Any] = field(default_factory=list)
    remaining: int = 0
    arrived: float = field(default_factory=time.monotonic)
    over: bool = False  # its Future is done (answered, failed, timed out, cancelled): read once a step, without a lock

    def __post_init__(self) -> None:
        self.client = self if self.client is None else self.client
        self.future.add_done_callback(self._over)

    def _over(self, _: Future[list[Any]]) -> None:
        self.over = True


@dataclass(eq=False)
class Queued:
    job: Job
    index: int
    length: int  # source pieces, for the token budget; 0: an empty sentence (no search)
    cost: int = 0  # the tokens its search may take (fair.py's Cost); 0: an empty sentence
    answered: bool = False

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
    started: float = field(default_factory=time.monotonic)
    arrived_at_early: int | None = None  # the batcher's sentences arrived when this batch first answered a request
    share: float = field(init=False)  # the tokens its sentences may cost per request (fair.py's Cost)

    def __post_init__(self) -> None:
        self.share = sum(q.cost for q in self.batch) / len(jobs_of(self.batch))

    def still_wanted(self) -> list[bool]:
        """Per sentence, whether its request still waits for it (not answered, timed out, cancelled, or gone)."""
        return [not (q.answered or q.job.over) for q in self.batch]

    @property
    def abandoned(self) -> bool:
        """No request waits for any of its sentences (all answered, timed out or gone): a batch that the others'
        shorter searches kept from its next step is dropped without one."""
        return all(q.job.over for q in self.batch)


def jobs_of(batch: list[Queued]) -> list[Job]:
    """The requests a batch's sentences belong to, each once."""
    return list({id(q.job): q.job for q in batch}.values())


def settle(future: Future[list[Any]], result: list[Any] | None = None, exception: Exception | None = None) -> None:
    """Set a Future's outcome unless it was cancelled meanwhile (its request timed out or went away)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result if result is not None else [])
    except InvalidStateError:
        pass
