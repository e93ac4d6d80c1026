"""The server's counters, written in Prometheus' text exposition format (version 0.0.4) for `GET /metrics`.

Requests by status code, the queue's length, and for each served model (labelled `model="NAME"`): sentences
translated, batch sizes (sentences, and requests sharing a batch) as histograms, search seconds, and request
latency as a summary: quantiles over its latest LATENCY_WINDOW answered requests. Requests a client abandoned
count under code 499 (it closed the connection before its answer). Counts are written as integers and sums of seconds in
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

    def lines(self, name: str, labels: str) -> list[str]:
        """Its samples, each with `labels` (`model="NAME"`) beside the bucket's `le`."""
        out = [f'{name}_bucket{{{labels},le="{bound:g}"}} {n}' for bound, n in zip(self.bounds, self.counts)]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        return [*out, f"{name}_sum{{{labels}}} {number(self.total)}", f"{name}_count{{{labels}}} {self.count}"]


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


def label(value: str) -> str:
    """A label value as Prometheus' text format quotes it (backslash, double quote and line feed escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class ModelCounts:
    """One served model's counters: the sentences of its answered requests, their latency, and its batches."""

    def __init__(self) -> None:
        self.sentences = 0
        self.answered = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self.latency_sum = 0.0
        self.batch_sentences = Histogram(SENTENCE_BUCKETS)
        self.batch_requests = Histogram(REQUEST_BUCKETS)
        self.batch_seconds = 0.0


class Metrics:
    """Thread-safe counters: the event loop counts requests, the worker thread batches; each served model (by its
    name, `models`) has its own series, labelled `model="NAME"`."""

    def __init__(self, queue_length: Callable[[], int], models: Sequence[str]) -> None:
        self.queue_length = queue_length
        self.lock = threading.Lock()
        self.requests: Counter[int] = Counter()
        self.models = {name: ModelCounts() for name in models}

    def request(self, status: int, sentences: int, seconds: float, model: str | None = None) -> None:
        """A /translate request answered with `status`; `model`: the one it asked for (None: not known, as for a
        body that could not be read)."""
        with self.lock:
            self.requests[status] += 1
            if status == 200 and model is not None:
                counts = self.models[model]
                counts.sentences += sentences
                counts.answered += 1
                counts.latencies.append(seconds)
                counts.latency_sum += seconds

    def batch(self, model: str, sentences: int, requests: int) -> None:
        with self.lock:
            counts = self.models[model]
            counts.batch_sentences.observe(sentences)
            counts.batch_requests.observe(requests)

    def searched(self, model: str, seconds: float) -> None:
        """A search step's seconds."""
        with self.lock:
            self.models[model].batch_seconds += seconds

    def text(self) -> str:
        """Every metric in Prometheus' text format."""
        with self.lock:
            models = [(f'model="{label(name)}"', counts) for name, counts in self.models.items()]
            lines = [
                "# HELP nmt_requests_total Requests to /translate, by HTTP status.",
                "# TYPE nmt_requests_total counter",
                *(f'nmt_requests_total{{code="{code}"}} {n}' for code, n in sorted(self.requests.items())),
                "# HELP nmt_sentences_total Sentences translated for answered requests, by model.",
                "# TYPE nmt_sentences_total counter",
                *(f"nmt_sentences_total{{{m}}} {c.sentences}" for m, c in models),
                "# HELP nmt_queue_sentences Sentences waiting for a batch.",
                "# TYPE nmt_queue_sentences gauge",
                f"nmt_queue_sentences {self.queue_length()}",
                "# HELP nmt_batch_sentences Sentences per batch searched, by model.",
                "# TYPE nmt_batch_sentences histogram",
                *(line for m, c in models for line in c.batch_sentences.lines("nmt_batch_sentences", m)),
                "# HELP nmt_batch_requests Requests whose sentences shared a batch, by model.",
                "# TYPE nmt_batch_requests histogram",
                *(line for m, c in models for line in c.batch_requests.lines("nmt_batch_requests", m)),
                "# HELP nmt_batch_seconds_total Time spent searching batches, by model.",
                "# TYPE nmt_batch_seconds_total counter",
                *(f"nmt_batch_seconds_total{{{m}}} {number(c.batch_seconds)}" for m, c in models),
                "# HELP nmt_request_seconds Latency of answered requests, by model "
                f"(quantiles of each one's last {LATENCY_WINDOW}).",
                "# TYPE nmt_request_seconds summary",
            ]
            for m, c in models:
                lines += [
                    *(
                        f'nmt_request_seconds{{{m},quantile="{q:g}"}} {number(quantile(c.latencies, q))}'
                        for q in QUANTILES
                    ),
                    f"nmt_request_seconds_sum{{{m}}} {number(c.latency_sum)}",
                    f"nmt_request_seconds_count{{{m}}} {c.answered}",
                ]
        return "\n".join(lines) + "\n"
