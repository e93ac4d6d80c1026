"""The batcher's scheduling policy (serve/batcher.py runs it): which queued sentences make the next batch and when,
whether it may start beside the running ones, and which running batch the worker steps next. No thread and no
lock here: the batcher holds its lock around every call.

The next batch is built around the oldest queued sentence, which waits for company: until as many sentences are
queued as the last batch answered plus those that waited through it (its clients come back with their next ones
moments after their answers), or `max_tokens` padded tokens are, or no sentence has arrived for `max_wait` (from
the oldest sentence's arrival, or the last batch's end when later). Company still arriving is waited for at most
RETURN_SHARE of a usual batch's search time from that end: the clients come back one after another, as fast as
the event loop answers and reads them, and a batch taken before they are back splits every later one. A lone
client is never kept waiting. The batch holds the sentences of every request that share the oldest one's search
settings (the job's `key`), packed by `batch_by_tokens` as `nmt generate` packs its input, the batch holding the
oldest one taken. Empty sentences cost nothing and ride along.

Up to MAX_RUNNING batches run (`may_start`): beside the running ones the next batch starts, without waiting, if a
slot is free and either each running one may still take twice the steps that batch may take at most (a * |x| + b
is known before the search), or each has run past twice the usual steps. The worker advances the running batch
with the fewest steps left at most, then the one that has run the fewest (least attained service, `choose`). A
short batch that arrives while an expensive one runs (the largest beam and output the caps allow) starts at once
and finishes about as it would alone, since a request's own sentences never start a batch beside its own
(queued.py's `startable`); a batch of the usual length is not joined (what arrives meanwhile waits for its end),
and one that ran long is not starved by a newer one.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from nmt_cli.data.batching import batch_by_tokens
from nmt_cli.serve.queued import Job, Queued, Running, startable, without

# (key, source pieces) -> the most decoder steps a sentence may take (its longest output and EOS, known before the
# search: a * |x| + b within the model's positions)
StepsBound = Callable[[Hashable, int], int]

# Batches searched at once, a step of one at a time: two let the short batches pass an expensive one; more would
# only add memory (each keeps to --max-batch-tokens; search/settings.py's refusal weighs one sentence's search).
MAX_RUNNING = 2
# A running batch is long, and a second one may start beside it, once it has run more than LONG_BATCH times the
# median steps of the last RECENT batches (none ended yet: at once).
LONG_BATCH = 2
RECENT = 32
# A queued batch passes the running one at once when the running one may still take PASS_FACTOR times its most
# steps or more: two batches of ordinary sentences (their bounds alike) do not split each other.
PASS_FACTOR = 2
# The answered clients coming back are waited for at most this share of the last RECENT batches' median search
# seconds (at least max_wait): benchmarks/bench_serve.py's mean batch and throughput, profile_serve.py --clients.
RETURN_SHARE = 0.25


class BatchPolicy:
    """The queue, and the batches it makes (see the module's docstring)."""

    def __init__(self, *, max_tokens: int, max_wait: float, steps_bound: StepsBound | None = None) -> None:
        self.max_tokens, self.max_wait, self.steps_bound = max_tokens, max_wait, steps_bound
        self.queue: list[Queued] = []
        self.free_since = time.monotonic()  # when the worker last finished a batch
        self.last_arrival = 0.0  # when the newest request was queued
        self.arrived = 0  # sentences queued so far
        self.last_key: Hashable = None  # the search settings of the batch that ended last
        self.expected = 1  # sentences worth waiting for: the last batch's and those queued at its end
        self.recent_steps: deque[int] = deque(maxlen=RECENT)  # the steps of the batches that ended last
        self.recent_seconds: deque[float] = deque(maxlen=RECENT)  # and their own search seconds

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, job: Job, lengths: Sequence[int]) -> None:
        """Queue a request's sentences, of `lengths` source pieces."""
        bound = self.steps_bound
        self.queue += [
            Queued(job, i, n, math.inf if bound is None else bound(job.key, n) if n else 0)
            for i, n in enumerate(lengths)
        ]
        self.last_arrival = job.arrived
        self.arrived += len(lengths)

    def drop_cancelled(self) -> None:
        """Forget queued sentences of requests answered (timed out, client gone, failed)."""
        self.queue = [q for q in self.queue if not q.job.over]

    def may_start(self, running: list[Running]) -> bool:
        """Whether a batch may start now: with none running; beside running ones, while a slot is free, when each
        may still take PASS_FACTOR times the steps the oldest startable sentence may take at most, or once each has
        run past LONG_BATCH times the usual steps (the median of the last batches): a batch of the usual length ends
        first (starting what arrived meanwhile beside it splits every later batch in two); a long one is passed."""
        if not running:
            return True
        if len(running) >= MAX_RUNNING:
            return False
        self.drop_cancelled()
        queued = startable(self.queue, running)
        if not queued:
            return False
        next_bound = queued[0].bound
        if math.isfinite(next_bound) and PASS_FACTOR * next_bound <= min(r.left for r in running):  # far longer
            return True
        if not self.recent_steps:  # no batch has ended yet: nothing is usual
            return True
        usual = statistics.median(self.recent_steps)
        return all(r.steps > LONG_BATCH * usual for r in running)

    def due(self, running: list[Running]) -> list[Queued] | float:
        """The batch of the oldest startable sentence, taken from the queue, once it is due (its company has come,
        or waiting for it is over); else the seconds until it is due (inf: none is queued). From the oldest arrival
        or the last batch's end, whichever is later: the clients that batch answered send their next sentences
        within moments; waiting for them beats running the few that queued during it, and once they are back (as
        many as expected) waiting gains nothing. Past max_wait only an idle worker waits, for the last batch's
        settings: beside a running batch another request (an expensive one) would start just as the answered
        clients are back."""
        self.drop_cancelled()
        queued = startable(self.queue, running)
        if not queued:
            return math.inf
        first = queued[0]
        since = max(first.job.arrived, self.free_since)
        returning = not running and first.job.key == self.last_key
        left = (self.wait_end(since) if returning else since + self.max_wait) - time.monotonic()
        count, padded = self.size(first.job.key, queued)
        if left <= 0 or padded >= self.max_tokens or count >= self.expected:
            return self.take(first.job.key, queued)
        return left

    def wait_end(self, since: float) -> float:
        """When waiting for company that started at `since` ends: `max_wait` after the newest arrival, while
        they keep coming, up to RETURN_SHARE of a usual batch's search seconds (at least `max_wait`) after `since`."""
        usual = statistics.median(self.recent_seconds) if self.recent_seconds else 0.0
        arriving = max(since, self.last_arrival) + self.max_wait
        return min(arriving, since + max(self.max_wait, RETURN_SHARE * usual))

    def size(self, key: Hashable, queued: list[Queued]) -> tuple[int, int]:
        """Sentences of `queued` searched with `key`, and their padded tokens (EOS included) batched together."""
        lengths = [q.length for q in queued if q.job.key == key]
        return len(lengths), len(lengths) * (max(lengths) + 1)

    def take(self, key: Hashable, queued: list[Queued]) -> list[Queued]:
        """Remove and return the batch of the oldest `key` sentence of `queued`, packed as generate packs it."""
        same = [q for q in queued if q.job.key == key]
        nonempty = [q for q in same if q.length > 0]
        chosen = [q for q in same if q.length == 0]
        if nonempty:
            lengths = np.array([q.length for q in nonempty], dtype=np.int64)
            budget = max(self.max_tokens, int(lengths.max()) + 1)  # as translate(): every sentence fits
            batches, _ = batch_by_tokens(lengths, lengths, budget, None)
            chosen += [nonempty[i] for i in next(b for b in batches if 0 in b).tolist()]  # the oldest's
        self.queue = without(self.queue, chosen)
        return chosen

    @staticmethod
    def choose(running: list[Running]) -> Running:
        """The running batch to step next: the fewest steps left at most, then the fewest run (least attained
        service); the older on a tie."""
        return min(running, key=lambda r: (r.left, r.steps))

    def answered_early(self, running: Running) -> None:
        """A batch has answered its first request early: from now it counts the sentences that arrive (its
        answered clients coming back, `ended`)."""
        if running.arrived_at_early is None:
            running.arrived_at_early = self.arrived

    def ended(self, running: Running, *, searched: bool) -> None:
        """A batch has ended (`searched`: its search returned), counted before its last answers go out: an answered
        client may be back at once, and counting its next sentence as well as its last made the next batch wait for
        one too many. Expected: the sentences queued, the batch's still waiting, and those answered early that are
        not back: as many as were answered early less those that have arrived since the first was (the clients that
        came back; a newcomer counts as one of them). The sentences of requests cancelled (timed out, client gone)
        are not expected back; a batch of only those leaves the expectation."""
        if searched:
            self.recent_steps.append(running.steps)
            self.recent_seconds.append(running.seconds)
        batch = running.batch
        self.free_since = time.monotonic()
        self.drop_cancelled()
        wanted = sum(not q.job.future.done() for q in batch)
        early = sum(q.answered and q.job.future.done() and not q.job.future.cancelled() for q in batch)
        back = 0 if running.arrived_at_early is None else min(early, self.arrived - running.arrived_at_early)
        if wanted + early:
            self.last_key, self.expected = batch[0].job.key, wanted + len(self.queue) + early - back
