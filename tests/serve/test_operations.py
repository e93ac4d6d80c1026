"""`nmt serve` as an operator runs it (issue 68), against a real process: /metrics for a scraper's own token."""

import http.client
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.serve.test_signals import ROOT, start_server, wait_ready

pytest.importorskip("uvicorn")


def call(port, method, path, token=None, body=None):
    """(status, body text) of one request, with `Authorization: Bearer TOKEN` when a token is given."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    conn.request(method, path, None if body is None else json.dumps(body), headers)
    response = conn.getresponse()
    return response.status, response.read().decode()


def test_metrics_answer_the_scraper_s_token_and_not_the_translation_key(tmp_path, tiny_checkpoint):
    (tmp_path / "key").write_text("translate-key\n")
    (tmp_path / "token").write_text("scrape-token\n")
    server, port, _ = start_server(
        tiny_checkpoint, "--api-key-file", tmp_path / "key", "--metrics-token-file", tmp_path / "token"
    )
    try:
        wait_ready(port)
        assert call(port, "POST", "/translate", "translate-key", {"text": "1 2 3"})[0] == 200
        assert call(port, "POST", "/translate", "scrape-token", {"text": "1 2 3"})[0] == 401  # it cannot translate
        assert call(port, "GET", "/metrics")[0] == 401
        assert call(port, "GET", "/metrics", "translate-key")[0] == 401
        status, text = call(port, "GET", "/metrics", "scrape-token")
    finally:
        server.kill()
        server.wait()
    assert status == 200
    assert "# TYPE nmt_request_seconds histogram" in text and "# TYPE nmt_queue_wait_seconds histogram" in text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert samples['nmt_request_seconds_count{model="src-tgt"}'] == "1"
    assert int(samples['nmt_queue_wait_seconds_count{model="src-tgt"}']) >= 1  # the warm-up's and the request's
    assert float(samples["process_resident_memory_bytes"]) > 10e6 and float(samples["process_open_fds"]) > 3


def test_past_req_limit_a_client_gets_429_with_retry_after(tiny_checkpoint):
    server, port, _ = start_server(tiny_checkpoint, "--req-limit", "2", "--char-limit-per-minute", "1000")
    try:
        wait_ready(port)
        answers = []
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/translate", json.dumps({"text": "1 2 3"}), {"Content-Type": "application/json"})
            response = conn.getresponse()
            answers.append((response.status, response.getheader("Retry-After"), json.loads(response.read())))
    finally:
        server.kill()
        server.wait()
    assert [status for status, _, _ in answers] == [200, 200, 429]
    _, retry_after, body = answers[2]
    assert 1 <= int(retry_after) <= 60 and "is past --req-limit 2" in body["error"]


def test_a_rotated_key_file_takes_effect_without_a_restart(tmp_path, tiny_checkpoint):
    keys = tmp_path / "keys"
    keys.write_text("first-key alice\n")
    server, port, _ = start_server(tiny_checkpoint, "--api-key-file", keys, "--req-limit", "100")
    try:
        wait_ready(port)
        body = {"text": "1 2 3"}
        before = [call(port, "POST", "/translate", key, body)[0] for key in ("first-key", "second-key")]
        rotated = tmp_path / "keys.new"
        rotated.write_text("second-key bob req-limit=1\n")  # bob's own limit: 1 request a minute
        rotated.replace(keys)
        after = [call(port, "POST", "/translate", key, body)[0] for key in ("first-key", "second-key", "second-key")]
    finally:
        server.kill()
        server.wait()
    assert before == [200, 401]
    assert after == [401, 200, 429]


def test_log_format_json_writes_lines_a_collector_parses(tmp_path, tiny_checkpoint):
    (tmp_path / "keys").write_text("s3cret-key team-a\n")
    server, port, lines = start_server(tiny_checkpoint, "--log-format", "json", "--api-key-file", tmp_path / "keys")
    try:
        wait_ready(port)
        call(port, "POST", "/translate", "s3cret-key", {"texts": ["1 2 3", "4 5"]})
        call(port, "POST", "/translate", "wrong", {"text": "1"})
    finally:
        server.terminate()
        server.wait(timeout=60)
    text = "".join(lines) + server.stderr.read()
    records = [json.loads(line) for line in text.splitlines()]  # every line, start-up and shutdown included
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", r["time"]) for r in records)
    access = [r for r in records if r.get("path") == "/translate"]
    assert [(r["status"], r["key_id"], r["sentences"]) for r in access] == [(200, "team-a", 2), (401, None, 0)]
    assert access[0]["model"] == "src-tgt" and access[0]["tokens"] > 0 and access[0]["latency_ms"] > 0
    assert access[0]["client"] == "127.0.0.1" and access[0]["request_id"] and access[0]["level"] == "INFO"
    assert "s3cret-key" not in text


def test_after_sigterm_ready_says_503_for_the_grace_while_requests_are_answered(tiny_checkpoint):
    server, port, _ = start_server(tiny_checkpoint, "--drain-grace", "30")
    try:
        wait_ready(port)
        server.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while call(port, "GET", "/ready")[0] != 503:  # the signal handled
            assert time.monotonic() < deadline
            time.sleep(0.02)
        status, body = call(port, "POST", "/translate", body={"text": "1 2 3"})  # sent within the grace
        health = call(port, "GET", "/health")[0]
        server.send_signal(signal.SIGTERM)  # a second signal ends the grace: the drain, then the exit
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
        server.wait()
    assert status == 200 and json.loads(body)["translations"] and health == 200


def test_the_server_listens_while_the_model_loads(tmp_path, tiny_checkpoint):
    """Loading held until the test releases it (Models.open waits for a file, in the server's process only)."""
    release = tmp_path / "release"
    start = (
        "import sys, time; from nmt_cli.serve.models import Models; opened = Models.open.__func__\n"
        "def held(cls, *args):\n"
        f"    while not __import__('os').path.exists({str(release)!r}): time.sleep(0.01)\n"
        "    return opened(cls, *args)\n"
        "Models.open = classmethod(held); from nmt_cli.__main__ import main; sys.argv[0] = 'nmt'; main()"
    )
    log = tmp_path / "stderr"
    with log.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-c", start, "serve", "--path", tiny_checkpoint, "--port", "0", "--device", "cpu"],
            cwd=ROOT,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening at http://127\.0\.0\.1:(\d+)", log.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        port = int(found.group(1))
        while True:  # the socket listens once uvicorn runs, a moment after the line
            try:
                loading = [call(port, "GET", "/health"), call(port, "GET", "/ready"), call(port, "POST", "/translate")]
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        assert "serving" not in log.read_text()  # still loading
        release.touch()
        wait_ready(port)
        translated = call(port, "POST", "/translate", body={"text": "1 2 3"})[0]
    finally:
        server.kill()
        server.wait()
    assert [status for status, _ in loading] == [200, 503, 503]
    assert json.loads(loading[1][1]) == {"ready": False} and translated == 200
