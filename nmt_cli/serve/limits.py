"""Limits over time per client, as LibreTranslate's --req-limit and daily limits: requests and
characters in fixed windows (a minute, a day), counted per client (its API key's id where the key file names one,
else its address) in bounded memory. A request past a limit is refused whole (nothing of it counted) with the
seconds until its window ends, for Retry-After."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

MAX_COUNTS = 100_000  # (client, limit) counts kept: past it those of ended windows go, then the oldest


@dataclass(frozen=True)
class RateLimit:
    """What a client may send over time (None: no limit); the server's, or one API key's own."""

    req_limit: int | None = None  # requests a minute
    char_limit_per_minute: int | None = None  # characters of text a minute
    req_limit_daily: int | None = None  # requests a day (UTC)


WINDOWS = {"req_limit": 60, "char_limit_per_minute": 60, "req_limit_daily": 86_400}  # each limit's window in seconds


class RateCounter:
    """Each client's requests and characters in the current windows; thread-safe (bodies are parsed on threads)."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.time) -> None:
        self.limit, self.clock = limit, clock
        self.counts: dict[tuple[str, str], tuple[int, int]] = {}  # (client, limit) -> (window, count)
        self.lock = threading.Lock()

    def take(self, client: str, chars: int, limit: RateLimit | None = None) -> tuple[str, float] | None:
        """Count a request of `chars` characters for `client` under `limit` (else the server's): None within every
        limit, else the limit it passes and the seconds until that limit's window ends (nothing counted)."""
        now, taken = self.clock(), []
        with self.lock:
            for f in fields(RateLimit):
                bound = getattr(limit or self.limit, f.name)
                if bound is not None:
                    window = int(now // WINDOWS[f.name])
                    held, used = self.counts.get((client, f.name), (window, 0))
                    used = (used if held == window else 0) + (chars if f.name == "char_limit_per_minute" else 1)
                    if used > bound:
                        return f"--{f.name.replace('_', '-')} {bound}", (window + 1) * WINDOWS[f.name] - now
                    taken.append(((client, f.name), (window, used)))
            if len(self.counts) + len(taken) > MAX_COUNTS:
                self.counts = {k: v for k, v in self.counts.items() if v[0] == int(now // WINDOWS[k[1]])}
                while len(self.counts) + len(taken) > MAX_COUNTS:
                    del self.counts[next(iter(self.counts))]
            self.counts.update(taken)
        return None
