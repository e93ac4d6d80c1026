"""The batcher's queue by client, and the fair rule that fills each batch from it: deficit round robin over tokens.

A client is the address a request comes from (app.py); a request of no known client is a client of its own. A
sentence's cost is the tokens its search may take: its rows at each step of its longest output (`Cost`). Each
client queues its requests in order, a request's sentences shortest first (a client alone gets generate's batches).
The clients take turns: the next batch is built around the first sentence of the client whose turn it is (`first`)
and holds sentences of its search settings (the job's `key`) from every client's queue but those of requests with a
batch running (`busy`). It is filled (`take`) in rounds: each adds to each client's deficit the cost of the costliest
sentence any may take next, and each takes its sentences, in order, while its deficit covers their cost and the
batch its padded tokens (`max_tokens`). So a client's big request takes a share of the batch like any other's, and
another client's single sentence goes into the same batch or, of other settings, the next one. A deficit is kept
while its client has sentences queued, and dropped with its last.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

from nmt_cli.serve.queued import Queued

# (key, source pieces) -> the tokens a sentence's search may take: its rows at each step of its longest output
Cost = Callable[[Hashable, int], int]


class FairQueue:
    """Queued sentences by client, in turn order (see the module's docstring)."""

    def __init__(self) -> None:
        self.queues: dict[Hashable, deque[Queued]] = {}  # by client, the one whose turn it is first
        self.deficits: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def add(self, sentences: list[Queued]) -> None:
        """Queue a request's sentences (one job's), shortest first, behind its client's earlier ones."""
        client = sentences[0].job.client
        self.queues.setdefault(client, deque()).extend(sorted(sentences, key=lambda q: q.length))

    def drop_cancelled(self) -> None:
        """Forget the sentences of requests answered (timed out, client gone, failed)."""
        for client, queue in list(self.queues.items()):
            if any(q.job.over for q in queue):
                self.queues[client] = deque(q for q in queue if not q.job.over)
                if not self.queues[client]:
                    self.forget(client)

    def forget(self, client: Hashable) -> None:
        del self.queues[client]
        self.deficits.pop(client, None)

    def waiting(self, busy: Busy, key: Hashable = None) -> Iterator[Queued]:
        """The sentences a batch may take (of `key`, where given), by client in turn order, each client's in order."""
        return (
            q
            for client, queue in self.queues.items()
            if client not in busy.clients
            for q in queue
            if id(q.job) not in busy.jobs and (key is None or q.job.key == key)
        )

    def first(self, busy: Busy) -> Queued | None:
        """The sentence the next batch is built around: the first of the client whose turn it is; None: none."""
        return next(self.waiting(busy), None)

    def take(self, key: Hashable, max_tokens: int, busy: Busy) -> list[Queued]:
        """Remove and return a batch of `key`'s sentences, filled by deficit round robin; the client whose turn it
        was goes last."""
        mine: dict[Hashable, deque[Queued]] = {}
        for q in self.waiting(busy, key):
            mine.setdefault(q.job.client, deque()).append(q)
        turn, taken = list(mine), []
        n, longest = 0, 0  # the batch's sentences with pieces, and the longest of them
        while turn:
            quantum = max(mine[c][0].cost for c in turn)
            for client in list(turn):
                next_ones, deficit = mine[client], self.deficits.get(client, 0) + quantum
                while next_ones and next_ones[0].cost <= deficit:
                    q = next_ones[0]
                    if q.length and n and (n + 1) * (max(longest, q.length) + 1) > max_tokens:
                        next_ones.clear()  # the batch has no room for its next one
                        break
                    taken.append(next_ones.popleft())
                    deficit -= q.cost
                    n, longest = n + (q.length > 0), max(longest, q.length)
                self.deficits[client] = deficit
                if not next_ones:
                    turn.remove(client)
        chosen = set(map(id, taken))
        for client in mine:
            self.queues[client] = deque(q for q in self.queues[client] if id(q) not in chosen)
            if not self.queues[client]:
                self.forget(client)
        if taken and (seed := taken[0].job.client) in self.queues:
            self.queues[seed] = self.queues.pop(seed)
        return taken


@dataclass(frozen=True)
class Busy:
    """What a new batch may not take: the sentences of requests with a batch running (`jobs`, their ids), and those
    of `clients` (those holding every slot)."""

    jobs: frozenset[int] = frozenset()
    clients: frozenset[Hashable] = frozenset()
