"""Dynamic batching across requests, with no HTTP in it: one worker thread drains a queue of sentences.

A request (a Job) puts its sentences in the queue and gets a Future of their results, in order. The worker takes
the oldest queued sentence and waits for company: until as many sentences are queued as the last batch answered
plus those that waited through it (its clients come back with their next ones moments after their answers), or
`max_tokens` padded tokens are, or no sentence has arrived for `max_wait` (from the oldest sentence's arrival,
or the last batch's end when later). Company still arriving is waited for at most RETURN_SHARE of a usual
batch's search time from that end: the clients come back one after another, as fast as the event loop answers
and reads them, and a batch taken before they are back splits every later one. A lone client is never kept
waiting. The batch holds the sentences of every request that share the oldest one's search settings (the job's
`key`), packed by `batch_by_tokens` as `nmt generate` packs its input, the batch holding the oldest one taken.
Empty sentences cost nothing and ride along.

A batch's search advances one decoder step per resumption (`RunBatch` returns a generator), and the worker keeps
up to `MAX_RUNNING` batches running (`_may_start`): between two steps it takes the next batch, by the same rule
but without waiting, if a slot is free and either the running one may still take twice the steps that batch may
take at most (`steps_bound`: a * |x| + b is known before the search), or it has run past twice the usual steps.
It advances the running batch with the fewest steps left at most, then the one that has run the fewest (least
attained service). A short batch that arrives while an expensive one runs (the largest beam and output the caps
allow) starts at once and finishes about as it would alone, since a request's own sentences never start a batch
beside its own (queued.py's `startable`); a batch of the usual length is not joined (what arrives meanwhile waits
for its end), and one that ran long is not starved by a newer one.
A sentence is answered as soon as the search has its result (a beam search's short sentences before the batch
ends, so their clients are back while it runs), a request with its last sentence. A cancelled request (timed
out, client gone) loses its sentences not yet started, and those of a running batch stop at the search's next
step (the whole batch when none is wanted, stepped or not), so that the others' latency does not depend on it.
`stop` refuses new requests, finishes the queued ones, and returns. Before its first batch the worker runs
`warm_up` (one sentence through the model), then sets `ready`; either way it sets `warmed`, with `warm_up_error`
holding what the warm-up raised (`nmt serve` refuses to start on it).

"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Hashable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from nmt_cli.data.batching import batch_by_tokens
from nmt_cli.errors import NmtError
from nmt_cli.serve.queued import Answer, Job, Queued, QueueFull, Running, Stopping, jobs_of, settle, startable, without

logger = logging.getLogger(__name__)

# (key, items, still_wanted, answer) -> a search that runs one step per resumption and returns one result per item,
# in order; still_wanted() says, per item, whether its request is still waiting (the search asks it once a step and
# drops the others: their results are not used); `answer` may be given some results early
RunBatch = Callable[[Hashable, list[Any], Callable[[], list[bool]], Answer], Generator[None, None, list[Any]]]
# (key, source pieces) -> the most decoder steps a sentence may take (its longest output and EOS, known before the
# search: a * |x| + b within the model's positions); None: unknown
StepsBound = Callable[[Hashable, int], int]
# (key, sentences, requests) of a batch that ended
OnBatch = Callable[[Hashable, int, int], None]
OnStep = Callable[[Hashable, float], None]  # (key, seconds) of a search step, as it ends

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


class Batcher:
    """A queue of sentences and the worker thread that batches them across requests."""

    def __init__(
        self,
        run: RunBatch,
        *,
        max_tokens: int,
        max_wait: float,
        max_queue: int,
        worker_context: Callable[[], AbstractContextManager[Any]] = nullcontext,
        on_batch: OnBatch | None = None,
        on_step: OnStep | None = None,
        warm_up: Callable[[], Any] | None = None,
        steps_bound: StepsBound | None = None,
    ) -> None:
        self.run, self.max_tokens, self.max_wait, self.max_queue = run, max_tokens, max_wait, max_queue
        self.steps_bound = steps_bound
        self.worker_context, self.on_batch, self.on_step, self.warm_up = worker_context, on_batch, on_step, warm_up
        self.ready = threading.Event()  # set once the worker has warmed up (GET /ready)
        self.warmed = threading.Event()  # set once the warm-up has ended, well or not
        self.warm_up_error: Exception | None = None  # what it raised
        self._queue: list[Queued] = []
        self._free_since = time.monotonic()  # when the worker last finished a batch
        self._last_arrival = 0.0  # when the newest request was queued
        self._arrived = 0  # sentences queued so far
        self._last_key: Hashable = None  # the search settings of the batch that ended last
        self._expected = 1  # sentences worth waiting for: the last batch's and those queued at its end
        self._recent_steps: deque[int] = deque(maxlen=RECENT)  # the steps of the batches that ended last
        self._recent_seconds: deque[float] = deque(maxlen=RECENT)  # and their own search seconds
        self._cond = threading.Condition()
        self._running: list[Running] = []  # the batches being searched (the worker's)
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="nmt-serve-worker", daemon=True)

    def start(self) -> None:
        """Start the worker, once (a second call does nothing)."""
        if self._thread.ident is None:
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Take no new requests, finish every queued sentence, and end the worker (waiting `timeout` at most)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def hurry(self) -> None:
        """Wait no more for company (`max_wait` 0): the server is draining, and no new clients will come."""
        with self._cond:
            self.max_wait = 0.0
            self._cond.notify_all()

    @property
    def running(self) -> bool:
        """The worker has not ended (after `stop` with a timeout: a batch was still being searched)."""
        return self._thread.is_alive()

    @property
    def queue_length(self) -> int:
        """Sentences waiting, not counting those of requests already cancelled (the worker drops them)."""
        with self._cond:
            self._drop_cancelled()
            return len(self._queue)

    def _drop_cancelled(self) -> None:
        """Forget queued sentences of requests answered (timed out, client gone, failed); the caller holds the lock."""
        self._queue = [q for q in self._queue if not q.job.over]

    def submit(self, key: Hashable, items: Sequence[Any], lengths: Sequence[int]) -> Future[list[Any]]:
        """Queue a request's sentences; the Future gets their results in order (or the batch's exception). Raises
        QueueFull where they would take the queue past `max_queue` sentences, Stopping once `stop` was called."""
        job = Job(key, items, results=[None] * len(items), remaining=len(items))
        if not items:
            job.future.set_result([])
            return job.future
        with self._cond:
            if self._stopping:
                raise Stopping("the server is shutting down")
            self._drop_cancelled()  # a request that timed out or went away holds no room
            if len(self._queue) + len(items) > self.max_queue:
                raise QueueFull(
                    f"the queue holds {len(self._queue)} sentences and takes {self.max_queue}; "
                    f"no room for {len(items)} more, try again shortly"
                )
            bound = self.steps_bound
            self._queue.extend(
                Queued(job, i, n, math.inf if bound is None else bound(key, n) if n else 0)
                for i, n in enumerate(lengths)
            )
            self._last_arrival = job.arrived
            self._arrived += len(items)
            self._cond.notify()
        return job.future

    def _work(self) -> None:
        with self.worker_context():
            self._warm()
            running = self._running
            while True:
                for gone in [r for r in running if r.abandoned]:
                    gone.search.close()
                    self._ended(gone)
                    running.remove(gone)
                if self._may_start(running) and (batch := self._next_batch(running)) is not None:
                    running.append(self._start(batch))
                if not running:
                    return  # stopped, and nothing is queued
                # the fewest steps left at most, then the fewest run (least attained service); the older on a tie
                chosen = min(running, key=lambda r: (r.left, r.steps))
                if self._step(chosen):
                    running.remove(chosen)

    def _may_start(self, running: list[Running]) -> bool:
        """Whether a batch may start now: with none running; beside running ones, while a slot is free, when each
        may still take PASS_FACTOR times the steps the oldest startable sentence may take at most, or once each has
        run past LONG_BATCH times the usual steps (the median of the last batches): a batch of the usual length ends
        first (starting what arrived meanwhile beside it splits every later batch in two); a long one is passed."""
        if not running:
            return True
        if len(running) >= MAX_RUNNING:
            return False
        with self._cond:
            self._drop_cancelled()
            queued = startable(self._queue, running)
            if not queued:
                return False
            next_bound = queued[0].bound
        if math.isfinite(next_bound) and PASS_FACTOR * next_bound <= min(r.left for r in running):  # far longer
            return True
        if not self._recent_steps:  # no batch has ended yet: nothing is usual
            return True
        usual = statistics.median(self._recent_steps)
        return all(r.steps > LONG_BATCH * usual for r in running)

    def _warm(self) -> None:
        """Run the warm-up, then set `ready` if it went well, and `warmed` either way."""
        try:
            if self.warm_up is not None:
                self.warm_up()
        except Exception as e:  # `nmt serve` refuses to start on it, in one error line; requests would fail alike
            logger.debug("the warm-up translation failed", exc_info=not isinstance(e, NmtError))
            self.warm_up_error = e
        else:
            if self.warm_up is not None:
                logger.info("ready: the model is loaded and warm")
            self.ready.set()
        finally:
            self.warmed.set()

    def _next_batch(self, running: list[Running]) -> list[Queued] | None:
        """Wait for the oldest startable sentence's company (or its deadline), then take its batch; None once
        stopped. Beside `running` batches, None at once unless a batch is ready to take."""
        wait = not running
        with self._cond:
            while True:
                self._drop_cancelled()
                queued = startable(self._queue, running)
                if not queued:
                    if self._stopping or not wait:
                        return None
                    self._cond.wait()
                    continue
                first = queued[0]
                # From the oldest arrival or the last batch's end, whichever is later: the clients that batch answered
                # send their next sentences within moments; waiting for them beats running the few that queued
                # during it, and once they are back (as many as expected) waiting gains nothing. Past max_wait only
                # an idle worker waits, for the last batch's settings: beside a running batch the wait is its next
                # step, and another request (an expensive one) would start just as the answered clients are back.
                since = max(first.job.arrived, self._free_since)
                returning = wait and first.job.key == self._last_key
                left = (self._wait_end(since) if returning else since + self.max_wait) - time.monotonic()
                count, padded = self._size(first.job.key, queued)
                if self._stopping or left <= 0 or padded >= self.max_tokens or count >= self._expected:
                    return self._take(first.job.key, queued)
                if not wait:
                    return None
                self._cond.wait(left)

    def _wait_end(self, since: float) -> float:
        """When waiting for company that started at `since` ends: `max_wait` after the newest arrival, while
        they keep coming, up to RETURN_SHARE of a usual batch's search seconds (at least `max_wait`) after `since`;
        the caller holds the lock."""
        usual = statistics.median(self._recent_seconds) if self._recent_seconds else 0.0
        arriving = max(since, self._last_arrival) + self.max_wait
        return min(arriving, since + max(self.max_wait, RETURN_SHARE * usual))

    def _size(self, key: Hashable, queued: list[Queued]) -> tuple[int, int]:
        """Sentences of `queued` searched with `key`, and their padded tokens (EOS included) batched together."""
        lengths = [q.length for q in queued if q.job.key == key]
        return len(lengths), len(lengths) * (max(lengths) + 1)

    def _take(self, key: Hashable, queued: list[Queued]) -> list[Queued]:
        """Remove and return the batch of the oldest `key` sentence of `queued`, packed as generate packs it."""
        same = [q for q in queued if q.job.key == key]
        nonempty = [q for q in same if q.length > 0]
        chosen = [q for q in same if q.length == 0]
        if nonempty:
            lengths = np.array([q.length for q in nonempty], dtype=np.int64)
            budget = max(self.max_tokens, int(lengths.max()) + 1)  # as translate(): every sentence fits
            batches, _ = batch_by_tokens(lengths, lengths, budget, None)
            chosen += [nonempty[i] for i in next(b for b in batches if 0 in b).tolist()]  # the oldest's
        self._queue = without(self._queue, chosen)
        return chosen

    def _start(self, batch: list[Queued]) -> Running:
        """The batch's search, not yet started (its first step encodes)."""
        items, key = [q.job.items[q.index] for q in batch], batch[0].job.key
        running: Running  # the search calls these from its steps, which start once it is assigned
        search = self.run(key, items, lambda: running.still_wanted(), lambda i, r: self._early(running, i, r))
        running = Running(batch, search)
        return running

    def _early(self, running: Running, i: int, result: Any) -> None:
        """Sentence i's result before its batch ends (`Answer`); from the first request it answers, the batch
        counts the sentences that arrive (its answered clients coming back, `_ended`)."""
        q = running.batch[i]
        q.answer(result)
        if running.arrived_at_early is None and q.job.future.done():
            with self._cond:
                running.arrived_at_early = self._arrived

    def _step(self, running: Running) -> bool:
        """Advance a batch's search by one step; True once it has ended, its requests answered (or failed)."""
        start = time.perf_counter()
        try:
            next(running.search)
        except StopIteration as stop:
            self._stepped(running, time.perf_counter() - start)
            self._answer(running, stop.value)
            return True
        except Exception as e:  # a bug or a device error: fail these requests, keep serving the others
            logger.exception("a batch of %d sentences failed", len(running.batch))
            self._ended(running)
            for job in jobs_of(running.batch):
                settle(job.future, exception=e)
            return True
        self._stepped(running, time.perf_counter() - start)
        running.steps += 1
        return False

    def _stepped(self, running: Running, seconds: float) -> None:
        running.seconds += seconds
        if self.on_step is not None:  # counted as it ends
            self.on_step(running.batch[0].job.key, seconds)

    def _answer(self, running: Running, results: list[Any]) -> None:
        """Answer a finished batch's requests; the next batch waits for the company this one expects."""
        self._recent_steps.append(running.steps)
        self._recent_seconds.append(running.seconds)
        self._ended(running)
        if self.on_batch is not None:  # counted before the answers go out: a client answered sees it
            self.on_batch(running.batch[0].job.key, len(running.batch), len(jobs_of(running.batch)))
        for q, result in zip(running.batch, results):
            q.answer(result)

    def _ended(self, running: Running) -> None:
        """Counted before the last answers go out: an answered client may be back at once, and counting its next
        sentence as well as its last made the next batch wait for one too many. Expected: the sentences queued, the
        batch's still waiting, and those answered early that are not back: as many as were answered early less
        those that have arrived since the first was (the clients that came back; a newcomer counts as one of them).
        The sentences of requests cancelled (timed out, client gone) are not expected back; a batch of only those
        leaves the expectation."""
        batch = running.batch
        with self._cond:
            self._free_since = time.monotonic()
            self._drop_cancelled()
            wanted = sum(not q.job.future.done() for q in batch)
            early = sum(q.answered and q.job.future.done() and not q.job.future.cancelled() for q in batch)
            back = 0 if running.arrived_at_early is None else min(early, self._arrived - running.arrived_at_early)
            if wanted + early:
                self._last_key, self._expected = batch[0].job.key, wanted + len(self._queue) + early - back
