"""The queue's records (serve/batcher.py): a request's Job, its sentences Queued, a Running batch's search, and
how their results reach the requests' Futures (early answers included)."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from nmt_cli.search.beam import Answers


class QueueFull(Exception):
    """The queue has no room for the request's sentences (HTTP 503)."""


class Stopping(Exception):
    """The server is shutting down and takes no new requests (HTTP 503)."""


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
    over: bool = False  # its Future is done (answered, failed, timed out, cancelled): read once a step, without a lock

    def __post_init__(self) -> None:
        self.future.add_done_callback(self._over)

    def _over(self, _: Future[list[Any]]) -> None:
        self.over = True


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
    # In flight (Admission.take, from its first step): the search's slots and which items it takes, as it last said;
    # its free slots then, less those it took, plus those its answered sentences have left since; whether it takes
    # more (not a whole batch's, nor once a new batch of its key has started); the sentences it has taken, and those
    # not answered yet by their number in the call (after the batch's, in the order taken): a batch that takes
    # sentences for hours holds its slots' alone
    slots: int = 0
    fits: Callable[[Any], bool] | None = None
    free: int = 0
    admitting: bool = True
    admitted: int = 0
    joined: dict[int, Queued] = field(default_factory=dict)
    end: float = field(init=False)  # the step by which every one of its sentences has ended at the latest

    def __post_init__(self) -> None:
        self.end = max((q.bound for q in self.batch), default=0)

    @property
    def left(self) -> float:
        """The most steps it may still take (inf: unknown)."""
        return self.end - self.steps

    def take(self, queue: list[Queued], free: int) -> list[Queued]:
        """In flight: the oldest queued sentences it takes (`takes`), at most `free`, joined to the batch at its current
        step in free slots, numbered after those taken before."""
        taken = [q for q in queue if takes(self, q)][:free]
        for q in taken:
            q.start_step = self.steps
            self.end = max(self.end, self.steps + q.bound)
            self.joined[len(self.batch) + self.admitted] = q
            self.admitted += 1
        self.free -= len(taken)
        return taken

    def answer(self, i: int, result: Any) -> Queued | None:
        """Sentence i's result, given as the search finishes it (its slot is free from the next step); None: one
        taken in flight whose request went away (its result is not used)."""
        q = self.batch[i] if i < len(self.batch) else self.joined.pop(i, None)
        if q is not None:
            q.answer(result)
            self.free += 1
        return q

    def searching(self) -> list[Queued]:
        """Its sentences not answered in flight: the batch's, and those taken since."""
        return [*self.batch, *self.joined.values()]

    @property
    def abandoned(self) -> bool:
        """No request waits for any of its sentences (all answered, timed out or gone): a batch that the others'
        shorter searches kept from its next step is dropped without one."""
        return all(q.job.over for q in chain(self.batch, self.joined.values()))


@dataclass
class Admission:
    """What an in-flight batch's search may ask of the queue between two steps: `take(free, slots, fits)` removes and
    returns the items of at most `free` queued sentences of the batch's key for which `fits(item)` holds (they join
    the batch, answered as its own), `slots` being the search's slots in all; `capacity`: the sentences the batcher
    expects to search at once."""

    take: Callable[[int, int, Callable[[Any], bool]], list[Any]]
    capacity: int


def admitting(admission: Admission) -> Callable[[int, int, int], list[Any]]:
    """search/in_flight.py's InFlight.admit over serve's queue: (free slots, slots, longest source) -> the token ids
    of the sentences taken (serve's Sentence records), those of no rule of their own (prefix, constraints,
    alignment) and 1 to `longest` pieces."""

    def admit(free: int, slots: int, longest: int) -> list[Any]:
        def fits(s: Any) -> bool:
            return s.prefix is None and not s.phrases and s.alignment is None and 0 < len(s.ids) <= longest

        return [s.ids for s in admission.take(free, slots, fits)]

    return admit


def takes(running: Running, q: Queued) -> bool:
    """Whether an in-flight batch would take the queued sentence q into a free slot: it still takes sentences, q is
    of its key, not empty, and one its search said it takes (any, before it tells)."""
    if not running.admitting or running.batch[0].job.key != q.job.key or q.length == 0:
        return False
    if running.fits is None:  # not told yet: its search tells at its first decoder step, or that it takes none
        return True
    return running.fits(q.job.items[q.index])


def has_room(running: Running, queue: list[Queued]) -> bool:
    """Whether an in-flight batch takes the oldest queued sentence at its next step, with every other queued one it
    would take: no more of them than its free slots. (More: its slots are too few for the clients, and a batch
    sized for them all may start beside it; it then takes no more, and ends.)"""
    if not queue or not takes(running, queue[0]):
        return False
    return sum(takes(running, q) for q in queue) <= running.free


def stranded(queue: list[Queued], running: list[Running], max_running: int) -> bool:
    """Whether the oldest queued sentence can start nowhere while the running batches go on: as many run as may,
    and none of them has room for it (it would not take it, or it is too small for the clients queued: `has_room`).
    In-flight batches then take no more, so that one ends and it starts (under steady load they would run
    forever; a batch of a few slots would take a crowd's sentences one at a time)."""
    if not queue or len(running) < max_running:
        return False
    return not any(has_room(r, queue) for r in running)


def superseding(key: Hashable, n: int, queue: list[Queued], running: list[Running]) -> int:
    """A batch of n sentences of `key` starts: the sentences its in-flight search should have slots for (its own,
    those of its key queued, and those in the slots of running batches of its key, whose clients' next sentences it
    takes from now: they take no more, and end)."""
    searching = 0
    for r in running:
        if r.batch[0].job.key == key:
            r.admitting, searching = False, searching + r.slots - r.free
    return n + sum(q.job.key == key for q in queue) + searching


class Capacities:
    """The slots an in-flight batch of a key starts with: at least as many as the key's last one had. Counted from
    the queue and the running batches alone, a new batch misses the clients whose answers are on their way back: a
    batch of 4 slots then started for 6 clients, a batch of 6 beside it for the 2 left over, the 4 coming back
    started one of 4 again, and the two ran side by side for two steps in three. A slot left free is one a
    returning client may take (search/in_flight.py keeps a bucket's slots too). Of the `KEEP` keys seen last."""

    KEEP = 64  # the search settings of a server's clients are few; a client varying them gets no more than this

    def __init__(self) -> None:
        self._last: OrderedDict[Hashable, int] = OrderedDict()

    def of(self, key: Hashable, wanted: int) -> int:
        """The slots of a new in-flight batch of `key` whose sentences and clients count `wanted`."""
        slots = max(wanted, self._last.pop(key, 0))
        self._last[key] = slots
        if len(self._last) > self.KEEP:
            self._last.popitem(last=False)
        return slots


def without(queue: list[Queued], taken: list[Queued]) -> list[Queued]:
    """The queue less the sentences taken from it."""
    chosen = set(map(id, taken))
    return [q for q in queue if id(q) not in chosen]


def startable(queue: list[Queued], running: list[Running]) -> list[Queued]:
    """The queued sentences a new batch may take: beside running batches, those of other requests. A request larger
    than a batch searches its batches one after another, so that it never holds both slots and a short request
    arriving meanwhile still starts beside it (batcher.py)."""
    busy = {id(job) for r in running for job in jobs_of(r.batch)}
    return [q for q in queue if id(q.job) not in busy] if busy else queue


def jobs_of(batch: list[Queued]) -> list[Job]:
    """The requests a batch's sentences belong to, each once."""
    return list({id(q.job): q.job for q in batch}.values())


class Waiting(Answers):
    """A running batch's `still_wanted` answers: per sentence of the call (the batch's, then those taken in flight),
    whether its request still waits for it (not answered, timed out, cancelled, or gone), read as the search asks:
    an in-flight search asks for its slots' sentences alone, once a step."""

    def __init__(self, running: Running) -> None:
        self.running = running

    def __len__(self) -> int:
        return len(self.running.batch) + self.running.admitted

    def answer(self, i: int) -> bool:
        batch, joined = self.running.batch, self.running.joined
        if i >= len(batch) + self.running.admitted:
            raise IndexError(i)
        q = batch[i] if i < len(batch) else joined.get(i)
        if q is None:  # taken in flight, and answered or gone since
            return False
        if q.answered or q.job.over:
            joined.pop(i, None)  # gone: the search stops it at this step and asks no more
            return False
        return True


def settle(future: Future[list[Any]], result: list[Any] | None = None, exception: Exception | None = None) -> None:
    """Set a Future's outcome unless it was cancelled meanwhile (its request timed out or went away)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result if result is not None else [])
    except InvalidStateError:
        pass
