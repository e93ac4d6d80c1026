"""Sentences per client (--max-client-sentences): one client, by its address, may have so many queued or in
progress; a request that would pass that gets 429 with Retry-After. A request holds its sentences until its Future
is done (answered, failed, timed out, cancelled, or its client gone). The event loop alone checks and adds.

A client is request.client.host, after uvicorn's proxy-header handling: behind a reverse proxy every client has the
proxy's address unless uvicorn trusts its X-Forwarded-For (--forwarded-allow-ips), which is why the limit is off by
default.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any


class ClientBusy(Exception):
    """A client's sentences would pass --max-client-sentences (HTTP 429)."""


class ClientLoad:
    """The sentences each client has queued or in progress, and the limit on them (None: no limit)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._held: dict[str, list[tuple[Future[Any], int]]] = {}  # client -> its requests' Futures and sizes

    def held(self, client: str) -> int:
        """Sentences `client` has queued or in progress; the requests answered, and clients left with none, go."""
        kept = {c: [(f, n) for f, n in held if not f.done()] for c, held in self._held.items()}
        self._held = {c: held for c, held in kept.items() if held}
        return sum(n for _, n in self._held.get(client, ()))

    def check(self, client: str, n_sentences: int) -> None:
        """Raises ClientBusy when `n_sentences` more would take `client` past the limit."""
        if self.limit is None:
            return
        held = self.held(client)
        if held + n_sentences > self.limit:
            raise ClientBusy(
                f"this client ({client}) has {held} sentences queued or in progress and may have {self.limit} "
                f"(--max-client-sentences); no room for {n_sentences} more: try again when they are answered"
            )

    def add(self, client: str, future: Future[Any], n_sentences: int) -> None:
        """Count a submitted request's sentences against `client` until `future` is done."""
        if self.limit is not None:
            self._held.setdefault(client, []).append((future, n_sentences))
