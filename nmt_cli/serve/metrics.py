"""The server's counters, written in Prometheus' text exposition format (version 0.0.4) for `GET /metrics`.

Requests by status code (499: the client closed the connection before its answer), the queue's length, and per
served model (`model="NAME"`): sentences, batch sizes, search seconds, queue and request seconds as histograms
(which a monitor can add up across replicas; a summary's quantiles cannot be); then the process's own metrics as
Prometheus' client library names them. Counts are written as integers and sums of seconds in full precision: a
six-digit rounding would freeze a long-running server's totals (1,200,007 read 1.20001e+06).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
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
        self.latency = Histogram(SECONDS_BUCKETS)
        self.queue_wait = Histogram(SECONDS_BUCKETS)
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
                counts.latency.observe(seconds)

    def batch(self, model: str, sentences: int, requests: int, waited: Sequence[float] = ()) -> None:
        """A batch searched: its sentences, the requests they belong to, and each sentence's seconds in the queue."""
        with self.lock:
            counts = self.models[model]
            counts.batch_sentences.observe(sentences)
            counts.batch_requests.observe(requests)
            for seconds in waited:
                counts.queue_wait.observe(seconds)

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
                "# HELP nmt_request_seconds Latency of answered requests, by model.",
                "# TYPE nmt_request_seconds histogram",
                *(line for m, c in models for line in c.latency.lines("nmt_request_seconds", m)),
                "# HELP nmt_queue_wait_seconds Seconds each sentence waited for its batch to start, by model.",
                "# TYPE nmt_queue_wait_seconds histogram",
                *(line for m, c in models for line in c.queue_wait.lines("nmt_queue_wait_seconds", m)),
            ]
        return "\n".join([*lines, *process_lines()]) + "\n"


PROCESS = (  # prometheus_client's process collector's names and help texts
    ("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."),
    ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes."),
    ("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds."),
    ("process_open_fds", "gauge", "Number of open file descriptors."),
)


def process_lines() -> list[str]:
    """The process's CPU seconds, memory, file descriptors and start time as prometheus_client's process collector
    writes them on Linux (from /proc; the CPU seconds alone where /proc is absent)."""
    cpu = os.times()
    values: list[float] = [cpu.user + cpu.system]
    with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
        stat = Path("/proc/self/stat").read_text().rpartition(")")[2].split()  # from the 3rd field on: its state
        boot = next(int(line[6:]) for line in Path("/proc/stat").read_text().splitlines() if line[:6] == "btime ")
        values += [
            int(stat[21]) * os.sysconf("SC_PAGE_SIZE"),
            boot + int(stat[19]) / os.sysconf("SC_CLK_TCK"),
            len(os.listdir("/proc/self/fd")),
        ]
    return [
        line
        for (name, kind, text), value in zip(PROCESS, values)
        for line in (f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {number(value)}")
    ]
