"""`GET /metrics`' text: counters and sums written exactly, so that a long-running server's totals keep moving."""

from nmt_cli.serve.metrics import Metrics, number


def test_counters_and_sums_are_written_exactly_past_a_million():
    metrics = Metrics(lambda: 0)
    metrics.batch(1_200_000, 3, 1_000_000.125)
    metrics.batch(7, 1, 0.000123456789)
    metrics.request(200, 1_200_007, 1234567.891)
    metrics.request(499, 0, 0.5)
    lines = dict(line.rsplit(" ", 1) for line in metrics.text().splitlines() if not line.startswith("#"))
    assert lines["nmt_sentences_total"] == "1200007"
    assert lines["nmt_batch_sentences_sum"] == "1200007"  # was 1.20001e+06: the sum stopped moving
    assert lines["nmt_batch_requests_sum"] == "4"
    assert float(lines["nmt_batch_seconds_total"]) == 1_000_000.125 + 0.000123456789
    assert lines["nmt_request_seconds_sum"] == "1234567.891"
    assert lines['nmt_requests_total{code="499"}'] == "1" and lines["nmt_request_seconds_count"] == "1"


def test_sample_values_as_prometheus_spells_them():
    assert [number(v) for v in (3, 0.1, 1e-7, float("nan"), float("inf"), -float("inf"))] == [
        "3",
        "0.1",
        "1e-07",
        "NaN",
        "+Inf",
        "-Inf",
    ]
