"""Limits over time per client (serve/limits.py): fixed windows of a minute and a day, a refused request not
counted, a key's own limits, and memory bounded however many clients come."""

from nmt_cli.serve import limits
from nmt_cli.serve.limits import RateCounter, RateLimit


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_requests_a_minute_then_the_next_minute():
    clock = Clock(600.0)  # a minute's window starts
    counter = RateCounter(RateLimit(req_limit=2), clock)
    assert counter.take("a", 10) is None and counter.take("a", 10) is None
    clock.now = 615.5
    assert counter.take("a", 10) == ("--req-limit 2", 44.5)  # the seconds left of this minute
    assert counter.take("b", 10) is None  # each client its own
    clock.now = 660.0
    assert counter.take("a", 10) is None


def test_characters_a_minute_and_requests_a_day():
    clock = Clock(86_400.0 * 3)
    counter = RateCounter(RateLimit(char_limit_per_minute=100, req_limit_daily=3), clock)
    assert counter.take("a", 60) is None
    assert counter.take("a", 50) == ("--char-limit-per-minute 100", 60.0)  # refused whole: its 50 not counted
    assert counter.take("a", 40) is None
    clock.now += 60
    assert counter.take("a", 1) is None
    clock.now += 3600
    assert counter.take("a", 1) == ("--req-limit-daily 3", 86_400 - 3660.0)


def test_a_key_s_own_limits_replace_the_server_s():
    counter = RateCounter(RateLimit(req_limit=1), Clock())
    assert counter.take("k", 1, RateLimit(req_limit=3)) is None
    assert counter.take("k", 1, RateLimit(req_limit=3)) is None
    assert counter.take("k", 1) is not None  # the server's limit for whoever has no own


def test_memory_stays_bounded(monkeypatch):
    monkeypatch.setattr(limits, "MAX_COUNTS", 100)
    clock = Clock(0.0)
    counter = RateCounter(RateLimit(req_limit=5, req_limit_daily=50), clock)
    for i in range(1000):
        clock.now = i * 0.5
        assert counter.take(f"client{i}", 1) is None
        assert len(counter.counts) <= 100
