"""The batcher's scheduling policy (serve/batcher.py runs it, holding its lock around every call): which queued
sentences make the next batch and when (`due`), whether it may start beside the running ones (`may_start`), and
which running batch the worker steps next (`choose`); fair.py keeps the queue by client and fills each batch.

Up to MAX_RUNNING batches run, a request's batches one after another. A short batch that arrives while an expensive
one runs starts at once, is stepped first and ends about as fast as alone; batches of ordinary sentences do not
split each other (what arrives while one runs waits for its end and batches together). Where one client's batches
hold every slot, one batch of another client starts beside them.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Hashable, Sequence

from nmt_cli.serve.fair import Busy, Cost, FairQueue
from nmt_cli.serve.queued import Job, Queued, Running

# Batches searched at once, a step of one at a time: two let the short batches pass an expensive one; more would
# only add memory (each keeps to --max-batch-tokens; search/settings.py's refusal weighs one sentence's search).
MAX_RUNNING = 2
# A queued batch passes the running ones at once when each costs PASS_FACTOR times the tokens per request that its
# first sentence costs, or more: two batches of ordinary sentences (their costs alike) do not split each other.
PASS_FACTOR = 2
# The answered clients coming back are waited for at most this share of the last RECENT batches' median search
# seconds (at least max_wait): benchmarks/bench_serve.py's mean batch and throughput, profile_serve.py --clients.
RETURN_SHARE = 0.25
RECENT = 32


class BatchPolicy:
    """The queue, and the batches it makes (see the module's docstring)."""

    def __init__(self, *, max_tokens: int, max_wait: float, cost: Cost | None = None) -> None:
        self.max_tokens, self.max_wait, self.cost = max_tokens, max_wait, cost
        self.queue = FairQueue()
        self.free_since = time.monotonic()  # when the worker last finished a batch
        self.last_arrival = 0.0  # when the newest request was queued
        self.arrived = 0  # sentences queued so far
        self.last_key: Hashable = None  # the search settings of the batch that ended last
        self.expected = 1  # sentences worth waiting for: the last batch's and those queued at its end
        self.recent_seconds: deque[float] = deque(maxlen=RECENT)  # the search seconds of the batches that ended last

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, job: Job, lengths: Sequence[int]) -> None:
        """Queue a request's sentences, of `lengths` source pieces."""
        cost = self.cost or (lambda key, n: n + 1)
        self.queue.add([Queued(job, i, n, cost(job.key, n) if n else 0) for i, n in enumerate(lengths)])
        self.last_arrival = job.arrived
        self.arrived += len(lengths)

    def may_start(self, running: list[Running]) -> bool:
        """Whether a batch may start now: with none running; beside running ones, while a slot is free, when each
        costs PASS_FACTOR times the tokens per request that the next batch's first sentence costs; beside one
        client's batches in every slot, one of another client."""
        if not running:
            return True
        self.queue.drop_cancelled()
        busy = busy_of(running)
        first = self.queue.first(busy)
        if first is None:
            return False
        if len(running) >= MAX_RUNNING:
            return len(running) == MAX_RUNNING and bool(busy.clients)  # one client holds every slot
        return PASS_FACTOR * first.cost <= min(r.share for r in running)

    def due(self, running: list[Running]) -> list[Queued] | float:
        """The next batch, taken from the queue, once it is due (its company has come: as many sentences as expected,
        `ended`, or `max_tokens` padded tokens; or waiting for it is over); else the seconds until it is due (inf:
        none is queued). A lone client is never kept waiting. From the oldest arrival or the last batch's end,
        whichever is later: the clients that batch answered send their next sentences within moments; waiting for
        them beats running the few that queued during it, and once they are back (as many as expected) waiting gains
        nothing. Past max_wait only an idle worker waits, for the last batch's settings: beside a running batch
        another request (an expensive one) would start just as the answered clients are back."""
        self.queue.drop_cancelled()
        busy = busy_of(running)
        first = self.queue.first(busy)
        if first is None:
            return math.inf
        key = first.job.key
        waiting = list(self.queue.waiting(busy, key))
        since = max(min(q.job.arrived for q in waiting), self.free_since)
        returning = not running and key == self.last_key
        left = (self.wait_end(since) if returning else since + self.max_wait) - time.monotonic()
        padded = sum(q.length > 0 for q in waiting) * (max(q.length for q in waiting) + 1)
        if left <= 0 or padded >= self.max_tokens or len(waiting) >= self.expected:
            return self.queue.take(key, self.max_tokens, busy)
        return left

    def wait_end(self, since: float) -> float:
        """When waiting for company that started at `since` ends: `max_wait` after the newest arrival, while
        they keep coming, up to RETURN_SHARE of a usual batch's search seconds (at least `max_wait`) after `since`."""
        usual = statistics.median(self.recent_seconds) if self.recent_seconds else 0.0
        arriving = max(since, self.last_arrival) + self.max_wait
        return min(arriving, since + max(self.max_wait, RETURN_SHARE * usual))

    @staticmethod
    def choose(running: list[Running]) -> Running:
        """The running batch to step next: the least tokens per request, then the fewest steps run (least attained
        service); the older on a tie."""
        return min(running, key=lambda r: (r.share, r.steps))

    def answered_early(self, running: Running) -> None:
        """A batch has answered its first request early: from now it counts the sentences that arrive (its
        answered clients coming back, `ended`)."""
        if running.arrived_at_early is None:
            running.arrived_at_early = self.arrived

    def ended(self, running: Running, *, searched: bool) -> None:
        """A batch has ended (`searched`: its search returned), counted before its last answers go out (an answered
        client may be back at once). Expected next: the sentences of its settings queued, the batch's still waiting,
        and those answered early less those arrived since the first was (a newcomer counts as one come back). The
        sentences of cancelled requests are not expected back; a batch of only those leaves the expectation."""
        if searched:
            self.recent_seconds.append(running.seconds)
        batch, key = running.batch, running.batch[0].job.key
        self.free_since = time.monotonic()
        self.queue.drop_cancelled()
        wanted = sum(not q.job.future.done() for q in batch)
        early = sum(q.answered and q.job.future.done() and not q.job.future.cancelled() for q in batch)
        back = 0 if running.arrived_at_early is None else min(early, self.arrived - running.arrived_at_early)
        if wanted + early:
            queued = sum(1 for _ in self.queue.waiting(Busy(), key))
            self.last_key, self.expected = key, wanted + queued + early - back


def busy_of(running: list[Running]) -> Busy:
    """What the next batch may not take: the requests with a batch running, and, where one client's batches hold
    every slot, that client's sentences."""
    clients = {q.job.client for r in running for q in r.batch}
    full = len(running) >= MAX_RUNNING and len(clients) == 1
    return Busy(frozenset(id(q.job) for r in running for q in r.batch), frozenset(clients) if full else frozenset())
