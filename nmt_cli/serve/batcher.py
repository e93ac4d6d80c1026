"""Dynamic batching across requests, with no HTTP in it: one worker thread drains a queue of sentences, batched
by serve/policy.py's rules (which batch, when, beside which running one, which steps next).

A request (a Job) queues its sentences and gets a Future of their results, in order. A batch's search advances one
decoder step per resumption (`RunBatch`), so that the worker can keep two batches running and step them in turn;
a sentence is answered as soon as the search has its result. A cancelled request (timed out, client gone) loses
its sentences not yet started, and those of a running batch stop at the search's next step, so that the others'
latency does not depend on it. `stop` refuses new requests, finishes the queued ones, and returns.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Generator, Hashable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from nmt_cli.errors import NmtError
from nmt_cli.serve.fair import Cost
from nmt_cli.serve.policy import BatchPolicy
from nmt_cli.serve.queued import Answer, Job, Queued, QueueFull, Running, Stopping, jobs_of, settle

logger = logging.getLogger(__name__)

# (key, items, still_wanted, answer) -> a search that runs one step per resumption and returns one result per item,
# in order; still_wanted() says, per item, whether its request is still waiting (the search asks it once a step and
# drops the others: their results are not used); `answer` may be given some results early
RunBatch = Callable[[Hashable, list[Any], Callable[[], list[bool]], Answer], Generator[None, None, list[Any]]]
# (key, sentences, requests, each sentence's seconds in the queue) of a batch that ended
OnBatch = Callable[[Hashable, int, int, list[float]], None]
OnStep = Callable[[Hashable, float], None]  # (key, seconds) of a search step, as it ends


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
        cost: Cost | None = None,
    ) -> None:
        self.run, self.max_queue = run, max_queue
        self.policy = BatchPolicy(max_tokens=max_tokens, max_wait=max_wait, cost=cost)
        self.worker_context, self.on_batch, self.on_step, self.warm_up = worker_context, on_batch, on_step, warm_up
        self.ready = threading.Event()  # set once the worker has warmed up (GET /ready)
        self.warmed = threading.Event()  # set once the warm-up has ended, well or not
        self.warm_up_error: Exception | None = None  # what it raised
        self._cond = threading.Condition()  # held around every call of the policy
        self._running: list[Running] = []  # the batches being searched (the worker's)
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="nmt-serve-worker", daemon=True)

    def start(self) -> None:
        """Start the worker, once (a second call does nothing)."""
        if self._thread.ident is None:
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Take no new requests, finish every queued sentence (waiting no more for company), and end the worker
        (waiting `timeout` at most)."""
        with self._cond:
            self._stopping = True
            self.hurry()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def hurry(self) -> None:
        """Wait no more for company (`max_wait` 0): the server is draining, and no new clients will come."""
        with self._cond:
            self.policy.max_wait = 0.0
            self._cond.notify_all()

    @property
    def running(self) -> bool:
        """The worker has not ended (after `stop` with a timeout: a batch was still being searched)."""
        return self._thread.is_alive()

    @property
    def queue_length(self) -> int:
        """Sentences waiting, not counting those of requests already cancelled (the worker drops them)."""
        with self._cond:
            self.policy.queue.drop_cancelled()
            return len(self.policy)

    def submit(
        self, key: Hashable, items: Sequence[Any], lengths: Sequence[int], client: Hashable = None
    ) -> Future[list[Any]]:
        """Queue a request's sentences (of `client`; None: a client of its own); the Future gets their results in
        order (or the batch's exception). Raises QueueFull where they would take the queue past `max_queue`
        sentences, Stopping once `stop` was called."""
        job = Job(key, items, client, results=[None] * len(items), remaining=len(items))
        if not items:
            job.future.set_result([])
            return job.future
        with self._cond:
            if self._stopping:
                raise Stopping("the server is shutting down")
            self.policy.queue.drop_cancelled()  # a request that timed out or went away holds no room
            if len(self.policy) + len(items) > self.max_queue:
                raise QueueFull(
                    f"the queue holds {len(self.policy)} sentences and takes {self.max_queue}; "
                    f"no room for {len(items)} more, try again shortly"
                )
            self.policy.add(job, lengths)
            self._cond.notify()
        return job.future

    def _work(self) -> None:
        with self.worker_context():
            self._warm()
            running = self._running
            while True:
                for gone in [r for r in running if r.abandoned]:
                    gone.search.close()
                    self._ended(gone, searched=False)
                    running.remove(gone)
                with self._cond:
                    may_start = self.policy.may_start(running)
                if may_start and (batch := self._next_batch(running)) is not None:
                    running.append(self._start(batch))
                if not running:
                    return  # stopped, and nothing is queued
                chosen = self.policy.choose(running)
                if self._step(chosen):
                    running.remove(chosen)

    def _warm(self) -> None:
        """Run the warm-up, then set `ready` if it went well, and `warmed` either way."""
        try:
            if self.warm_up is not None:
                self.warm_up()
                logger.info("ready: the model is loaded and warm")
        except Exception as e:  # `nmt serve` refuses to start on it, in one error line; requests would fail alike
            logger.debug("the warm-up translation failed", exc_info=not isinstance(e, NmtError))
            self.warm_up_error = e
        else:
            self.ready.set()
        finally:
            self.warmed.set()

    def _next_batch(self, running: list[Running]) -> list[Queued] | None:
        """The next batch, once it is due (an idle worker waits for it; None once stopped); beside `running`
        batches, None at once unless one is due."""
        with self._cond:
            while True:
                due = self.policy.due(running)
                if isinstance(due, list):
                    return due
                if running or (self._stopping and math.isinf(due)):
                    return None
                self._cond.wait(None if math.isinf(due) else due)

    def _start(self, batch: list[Queued]) -> Running:
        """The batch's search, not yet started (its first step encodes)."""
        items, key = [q.job.items[q.index] for q in batch], batch[0].job.key
        running: Running  # the search calls these from its steps, which start once it is assigned
        search = self.run(key, items, lambda: running.still_wanted(), lambda i, r: self._early(running, i, r))
        running = Running(batch, search)
        return running

    def _early(self, running: Running, i: int, result: Any) -> None:
        """Sentence i's result before its batch ends (`Answer`)."""
        q = running.batch[i]
        q.answer(result)
        if q.job.future.done():
            with self._cond:
                self.policy.answered_early(running)

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
            self._ended(running, searched=False)
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
        self._ended(running, searched=True)
        if self.on_batch is not None:  # counted before the answers go out: a client answered sees it
            waited = [running.started - q.job.arrived for q in running.batch]
            self.on_batch(running.batch[0].job.key, len(running.batch), len(jobs_of(running.batch)), waited)
        for q, result in zip(running.batch, results):
            q.answer(result)

    def _ended(self, running: Running, *, searched: bool) -> None:
        with self._cond:
            self.policy.ended(running, searched=searched)
