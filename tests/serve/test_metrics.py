"""`GET /metrics`' text: counters and sums written exactly, so that a long-running server's totals keep moving."""

import re
import time

from nmt_cli.serve.metrics import Metrics, number


def test_counters_and_sums_are_written_exactly_past_a_million():
    metrics = Metrics(lambda: 0, ["en-de"])
    metrics.batch("en-de", 1_200_000, 3)
    metrics.searched("en-de", 1_000_000.125)
    metrics.batch("en-de", 7, 1)
    metrics.searched("en-de", 0.000123456789)
    metrics.request(200, 1_200_007, 1234567.891, "en-de")
    metrics.request(499, 0, 0.5, "en-de")
    lines = samples(metrics.text())
    assert lines['nmt_sentences_total{model="en-de"}'] == "1200007"
    assert lines['nmt_batch_sentences_sum{model="en-de"}'] == "1200007"  # was 1.20001e+06: the sum stopped moving
    assert lines['nmt_batch_requests_sum{model="en-de"}'] == "4"
    assert float(lines['nmt_batch_seconds_total{model="en-de"}']) == 1_000_000.125 + 0.000123456789
    assert lines['nmt_request_seconds_sum{model="en-de"}'] == "1234567.891"
    assert lines['nmt_requests_total{code="499"}'] == "1" and lines['nmt_request_seconds_count{model="en-de"}'] == "1"


def test_each_model_has_its_own_series():
    """Several models served: every per-model series is labelled model="NAME", each counts its own batches and
    requests, a model not yet asked for shows zeros, and a request whose body named no model (a 400) counts only
    under its status."""
    metrics = Metrics(lambda: 3, ["en-de", "de-en", 'odd"name'])
    metrics.batch("en-de", 5, 2)
    metrics.searched("en-de", 0.5)
    metrics.batch("de-en", 1, 1)
    metrics.searched("de-en", 0.25)
    metrics.request(200, 3, 0.2, "en-de")
    metrics.request(200, 2, 0.4, "en-de")
    metrics.request(200, 1, 0.1, "de-en")
    metrics.request(400, 0, 0.01, None)
    text = metrics.text()
    lines = samples(text)
    assert lines['nmt_sentences_total{model="en-de"}'] == "5" and lines['nmt_sentences_total{model="de-en"}'] == "1"
    assert lines['nmt_batch_sentences_bucket{model="en-de",le="4"}'] == "0"
    assert lines['nmt_batch_sentences_bucket{model="en-de",le="8"}'] == "1"
    assert lines['nmt_batch_sentences_count{model="de-en"}'] == "1"
    assert lines['nmt_batch_seconds_total{model="de-en"}'] == "0.25"
    assert lines['nmt_request_seconds_bucket{model="en-de",le="0.25"}'] == "1"  # 0.2 of 0.2 and 0.4
    assert lines['nmt_request_seconds_bucket{model="en-de",le="0.5"}'] == "2"
    assert lines['nmt_request_seconds_count{model="de-en"}'] == "1"
    assert lines['nmt_sentences_total{model="odd\\"name"}'] == "0"  # quoted as the text format escapes it
    assert lines['nmt_request_seconds_bucket{model="odd\\"name",le="+Inf"}'] == "0"
    assert lines['nmt_requests_total{code="200"}'] == "3" and lines['nmt_requests_total{code="400"}'] == "1"
    assert lines["nmt_queue_sentences"] == "3"
    assert all(PROMETHEUS_LINE.fullmatch(line) for line in text.splitlines()), text


# A line of Prometheus' text format: a comment (HELP, TYPE), or a sample: name, optional labels, value
PROMETHEUS_LINE = re.compile(
    r'# (HELP|TYPE) [a-z_]+ .+|[a-z_]+(\{[a-z_]+="([^"\\]|\\.)*"(,[a-z_]+="([^"\\]|\\.)*")*\})? [^ ]+'
)


def samples(text):
    """A Prometheus text's samples: {name with its labels: value}."""
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))


def test_sample_values_as_prometheus_spells_them():
    assert [number(v) for v in (3, 0.1, 1e-7, float("nan"), float("inf"), -float("inf"))] == [
        "3",
        "0.1",
        "1e-07",
        "NaN",
        "+Inf",
        "-Inf",
    ]


def test_latency_is_a_histogram_and_the_process_metrics_are_prometheus_clients():
    """Histograms (unlike a summary's quantiles) add up across replicas; the process metrics carry the names a
    dashboard for any Prometheus client expects."""
    metrics = Metrics(lambda: 0, ["en-de"])
    for seconds in (0.003, 0.04, 0.04, 7.0, 500.0):
        metrics.request(200, 1, seconds, "en-de")
    text = metrics.text()
    lines = samples(text)
    assert "# TYPE nmt_request_seconds histogram" in text and "summary" not in text
    buckets = {
        le: lines[f'nmt_request_seconds_bucket{{model="en-de",le="{le}"}}'] for le in ("0.005", "0.05", "10", "+Inf")
    }
    assert buckets == {"0.005": "1", "0.05": "3", "10": "4", "+Inf": "5"}
    assert lines['nmt_request_seconds_count{model="en-de"}'] == "5"
    for name, kind in [
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ]:
        assert f"# TYPE {name} {kind}" in text and float(lines[name]) > 0, name
    with open("/proc/self/status") as status:  # the kernel's own count of this process's resident memory
        rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
    assert abs(float(lines["process_resident_memory_bytes"]) - rss) < 0.2 * rss
    assert time.time() - 86400 < float(lines["process_start_time_seconds"]) <= time.time()  # this test's process
    assert all(PROMETHEUS_LINE.fullmatch(line) for line in text.splitlines()), text


def test_each_sentence_s_wait_in_the_queue_is_a_histogram():
    metrics = Metrics(lambda: 0, ["en-de"])
    metrics.batch("en-de", 3, 2, [0.001, 0.02, 3.0])
    lines = samples(metrics.text())
    assert lines['nmt_queue_wait_seconds_bucket{model="en-de",le="0.005"}'] == "1"
    assert lines['nmt_queue_wait_seconds_bucket{model="en-de",le="0.025"}'] == "2"
    assert lines['nmt_queue_wait_seconds_count{model="en-de"}'] == "3"
    assert float(lines['nmt_queue_wait_seconds_sum{model="en-de"}']) == 3.021
