"""The server's counters, written in Prometheus' text exposition format (version 0.0.4) for `GET /metrics`.

Requests by status code, sentences translated, the queue's length, batch sizes (sentences, and requests
sharing a batch) as histograms, and request latency as a
summary: quantiles over the latest LATENCY_WINDOW answered requests. Requests a client abandoned count under
code 499 (it closed the connection before its answer). Counts are written as integers and sums of seconds in
full precision: a six-digit rounding would freeze a long-running server's totals (1,200,007 read 1.20001e+06).
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence

LATENCY_WINDOW = 2048
QUANTILES = (0.5, 0.9, 0.99)
SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
REQUEST_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Histogram:
    """Cumulative buckets, their sum and count, as Prometheus keeps them."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)
        self.total: float = 0  # stays an int while the values observed are ints (sentences, requests)
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{bound:g}"}} {n}' for bound, n in zip(self.bounds, self.counts)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        return [*out, f"{name}_sum {number(self.total)}", f"{name}_count {self.count}"]


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile of values (NaN when there are none, as Prometheus writes it)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def number(value: float) -> str:
    """A sample value as Prometheus spells it, exactly: an int as digits, a float as its shortest repr that reads
    back the same (NaN and +Inf, not nan and inf)."""
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class Metrics:
    """Thread-safe counters: the event loop counts requests, the worker thread batches."""

    def __init__(self, queue_length: Callable[[], int]) -> None:
        self.queue_length = queue_length
        self.lock = threading.Lock()
        self.requests: Counter[int] = Counter()
        self.sentences = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self.latency_sum = 0.0
        self.batch_sentences = Histogram(SENTENCE_BUCKETS)
        self.batch_requests = Histogram(REQUEST_BUCKETS)
        self.batch_seconds = 0.0

    def request(self, status: int, sentences: int, seconds: float) -> None:
        with self.lock:
            self.requests[status] += 1
            if status == 200:
                self.sentences += sentences
                self.latencies.append(seconds)
                self.latency_sum += seconds

    def batch(self, sentences: int, requests: int, seconds: float) -> None:
        with self.lock:
            self.batch_sentences.observe(sentences)
            self.batch_requests.observe(requests)
            self.batch_seconds += seconds

    def text(self) -> str:
        """Every metric in Prometheus' text format."""
        with self.lock:
            lines = [
                "# HELP nmt_requests_total Requests to /translate, by HTTP status.",
                "# TYPE nmt_requests_total counter",
                *(f'nmt_requests_total{{code="{code}"}} {n}' for code, n in sorted(self.requests.items())),
                "# HELP nmt_sentences_total Sentences translated for answered requests.",
                "# TYPE nmt_sentences_total counter",
                f"nmt_sentences_total {self.sentences}",
                "# HELP nmt_queue_sentences Sentences waiting for a batch.",
                "# TYPE nmt_queue_sentences gauge",
                f"nmt_queue_sentences {self.queue_length()}",
                "# HELP nmt_batch_sentences Sentences per batch searched.",
                "# TYPE nmt_batch_sentences histogram",
                *self.batch_sentences.lines("nmt_batch_sentences"),
                "# HELP nmt_batch_requests Requests whose sentences shared a batch.",
                "# TYPE nmt_batch_requests histogram",
                *self.batch_requests.lines("nmt_batch_requests"),
                "# HELP nmt_batch_seconds_total Time spent searching batches.",
                "# TYPE nmt_batch_seconds_total counter",
                f"nmt_batch_seconds_total {number(self.batch_seconds)}",
                f"# HELP nmt_request_seconds Latency of answered requests (quantiles of the last {LATENCY_WINDOW}).",
                "# TYPE nmt_request_seconds summary",
                *(f'nmt_request_seconds{{quantile="{q:g}"}} {number(quantile(self.latencies, q))}' for q in QUANTILES),
                f"nmt_request_seconds_sum {number(self.latency_sum)}",
                f"nmt_request_seconds_count {self.requests[200]}",
            ]
        return "\n".join(lines) + "\n"
