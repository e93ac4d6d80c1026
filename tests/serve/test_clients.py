"""--max-client-sentences: a client (its address) past its sentences queued or in progress gets 429 with
Retry-After, and a request holds its sentences only until it is answered, times out, or is cancelled."""

import http.client
import json
import threading
import time
from concurrent.futures import Future

import pytest

from nmt_cli.config import ServeConfig
from nmt_cli.errors import ConfigError
from nmt_cli.serve.clients import ClientBusy, ClientLoad
from tests.serve.serving import serving
from tests.serve.test_bounds import SlowSteps
from tests.serve.test_signals import start_server, wait_ready


def test_a_clients_sentences_count_until_its_requests_are_done_however_they_end():
    load = ClientLoad(4)
    answered, cancelled, failed, open_ = Future(), Future(), Future(), Future()
    for future, n in ((answered, 1), (cancelled, 1), (failed, 1), (open_, 1)):
        load.check("10.0.0.1", n)
        load.add("10.0.0.1", future, n)
    load.check("10.0.0.2", 4)  # another client has its own room
    with pytest.raises(ClientBusy, match=r"\(10\.0\.0\.1\) has 4 sentences queued or in progress and may have 4"):
        load.check("10.0.0.1", 1)
    answered.set_result([])
    cancelled.cancel()
    failed.set_exception(RuntimeError("a batch failed"))
    assert load.held("10.0.0.1") == 1
    load.check("10.0.0.1", 3)
    open_.cancel()
    assert load.held("10.0.0.1") == 0 and load._held == {}  # no client is remembered once it holds nothing


def test_without_a_limit_nothing_is_counted():
    load = ClientLoad(None)
    load.add("10.0.0.1", Future(), 10_000)
    load.check("10.0.0.1", 10_000)
    assert load.held("10.0.0.1") == 0


def test_a_request_a_client_could_never_send_is_refused_at_start():
    with pytest.raises(ConfigError, match="--max-request-sentences 256 exceeds --max-client-sentences 8"):
        ServeConfig(path="x.pt", max_client_sentences=8)
    assert ServeConfig(path="x.pt", max_client_sentences=8, max_request_sentences=8).max_client_sentences == 8


def held(client):
    return client.app.state.server.clients.held("testclient")


def wait_until(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_client_past_its_sentences_gets_429_until_they_are_answered(tiny_checkpoint):
    limits = {"max_client_sentences": 3}
    with serving(tiny_checkpoint, max_request_sentences=3, limits=limits, search={"max_len_b": 5}) as client:
        slow = SlowSteps(client.app.state.server.served.searcher.translator.model, 0.05)  # a request stays in progress
        first = []
        sender = threading.Thread(target=lambda: first.append(client.post("/translate", json={"texts": ["1", "2"]})))
        sender.start()
        wait_until(lambda: held(client) == 2)
        busy = client.post("/translate", json={"texts": ["3", "4"]})
        fits = client.post("/translate", json={"text": "3"})  # one more fits in the 3
        sender.join()
        slow.delay = 0
        assert held(client) == 0
        after = client.post("/translate", json={"texts": ["3", "4", "5"]})
        metrics = client.get("/metrics").text
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"].startswith("this client (testclient) has 2 sentences queued or in progress")
    assert "(--max-client-sentences); no room for 2 more" in busy.json()["error"]
    assert fits.status_code == first[0].status_code == after.status_code == 200
    assert 'nmt_requests_total{code="429"} 1' in metrics


def test_a_request_that_times_out_frees_its_clients_room_at_once(tiny_checkpoint):
    limits = {"max_client_sentences": 2}
    with serving(tiny_checkpoint, timeout=1.5, max_request_sentences=2, limits=limits) as client:
        slow = SlowSteps(
            client.app.state.server.served.searcher.translator.model, 0.1
        )  # 200 steps: far past the timeout
        worst = {"beam": 16, "min_len": 200, "max_len_a": 0, "max_len_b": 200}
        late = client.post("/translate", json={"texts": ["1 2", "3"], **worst})
        assert held(client) == 0  # its Future was cancelled with the 504, while its batch may still be stopping
        slow.delay = 0
        again = client.post("/translate", json={"texts": ["1 2", "3"]})
    assert late.status_code == 504 and again.status_code == 200


def test_a_client_is_the_address_a_trusted_proxy_forwards(tiny_checkpoint):
    # uvicorn trusts X-Forwarded-For from the loopback addresses by default; here only from another address
    proc, port, _ = start_server(tiny_checkpoint, "--max-client-sentences", "256", "--forwarded-allow-ips", "10.9.9.9")
    try:
        wait_ready(port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Content-Type": "application/json", "X-Forwarded-For": "203.0.113.7"}
        conn.request("POST", "/translate", json.dumps({"text": "1 2"}), headers)
        assert conn.getresponse().status == 200
    finally:
        proc.terminate()
        log = proc.communicate(timeout=30)[1]
    assert "127.0.0.1 POST /translate 200" in log and "203.0.113.7" not in log
