"""Fair shares between clients (serve/fair.py, serve/policy.py): a client's big request takes its share of a batch
and of the worker, and no more; another client's single sentence is not kept behind it."""

import http.client
import json
import threading
import time

from nmt_cli.serve.batcher import Batcher
from nmt_cli.serve.fair import Busy, FairQueue
from nmt_cli.serve.queued import Job, Queued
from tests.serve.test_batcher import Recorder
from tests.serve.test_signals import metrics, start_server, wait_ready


def test_a_big_request_cannot_keep_another_clients_sentence_out_of_the_next_batch():
    """One client's 20 sentences, then another client's one: the batch holds 6 and the other client's is among them
    (served from the oldest, it waited for the big request's four batches: the queue sorted its 9 pieces last)."""
    run = Recorder()
    batcher = Batcher(run, max_tokens=60, max_wait=0.0, max_queue=100)
    big = batcher.submit("k", [f"big{i}" for i in range(20)], [5] * 20, client="10.0.0.1")
    one = batcher.submit("k", ["one"], [9], client="10.0.0.2")
    batcher.start()
    assert one.result(timeout=10) == ["k:one"] and len(big.result(timeout=10)) == 20
    batcher.stop(timeout=10)
    assert "one" in run.batches[0][1] and len(run.batches[0][1]) == 6  # 6 x (9 + 1) = the 60 tokens


def test_clients_share_a_batch_by_tokens_and_a_request_keeps_its_order():
    """Two clients with more than a batch each: deficit round robin gives each about half its tokens, whatever
    their sentences' costs; a request's sentences come shortest first, and the turn passes on after a batch."""
    queue = FairQueue()
    cheap, dear = Job("k", ["c"] * 30, "a"), Job("k", ["d"] * 10, "b")
    queue.add([Queued(cheap, i, 3, 10) for i in range(30)])
    queue.add([Queued(dear, i, 3 - i % 2, 30) for i in range(10)])
    batch = queue.take("k", max_tokens=64, busy=Busy())
    tokens = {"a": 0, "b": 0}
    for q in batch:
        tokens[q.job.client] += q.cost
    assert len(batch) == 16 and tokens == {"a": 120, "b": 120}  # 16 sentences of up to 3 pieces: 64 tokens
    assert [q.length for q in batch if q.job is dear] == [2] * 4  # its shortest first
    assert list(queue.queues) == ["b", "a"]  # the next batch starts with the other client's
    assert queue.first(Busy(frozenset({id(dear)}))).job is cheap  # a request's batches run one after another


def test_a_client_holding_every_slot_does_not_keep_another_clients_request_waiting():
    """One client's two expensive requests (of two search settings: two batches) take both slots; another client's
    cheap one starts beside them and is answered before either ends (served from the oldest, it waited for one)."""
    run = Recorder(delay=0.005, steps=lambda key: 3 if key == "small" else 60)
    costs = {"big1": 1000, "big2": 300, "small": 4}  # big2 costs less than half of big1 per request: it passes
    batcher = Batcher(run, max_tokens=1000, max_wait=0.0, max_queue=100, cost=lambda key, n: costs[key])
    bigs = [batcher.submit(key, ["x"], [1], client="10.0.0.1") for key in ("big1", "big2")]
    batcher.start()
    while "big2" not in run.trace:  # both searched
        time.sleep(0.001)
    small = batcher.submit("small", ["y"], [1], client="10.0.0.2")
    assert small.result(timeout=5) == ["small:y"] and not any(f.done() for f in bigs)
    assert [f.result(timeout=10) for f in bigs] == [["big1:x"], ["big2:x"]]
    batcher.stop(timeout=10)
    assert run.most_running == 3 and run.finished[0] == "small"


def post(port, body, client):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json", "X-Forwarded-For": client}  # uvicorn trusts loopback proxies
    conn.request("POST", "/translate", json.dumps(body), headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_a_real_servers_clients_by_address_get_their_share(tiny_checkpoint):
    """`nmt serve` with the caps the guide gives a server of untrusted clients: one client sends two of the most
    expensive requests they allow, which take both slots, then another client one sentence, answered while both
    are still searched (served from the oldest, it waited for one of them to end)."""
    caps = ["--max-beam", "8", "--max-output-tokens", "200", "--max-request-sentences", "64"]
    proc, port, _ = start_server(tiny_checkpoint, *caps)
    try:
        wait_ready(port)
        worst = {"texts": ["1 2 3 4 5 6 7 8"] * 64, "beam": 8, "min_len": 200, "max_len_a": 0, "max_len_b": 200}
        answers = {}
        senders = [
            threading.Thread(target=lambda i=i: answers.__setitem__(i, post(port, worst, "10.0.0.1"))) for i in range(2)
        ]
        for sender in senders:
            sender.start()
        while sum(float(v) for k, v in metrics(port).items() if k.startswith("nmt_batch_seconds_total")) < 0.2:
            time.sleep(0.01)  # both searching
        status, body = post(port, {"text": "1 2 3"}, "10.0.0.2")
        expensive_done = len(answers)
        for sender in senders:
            sender.join()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert status == 200 and body["translations"][0]["text"]
    assert expensive_done == 0, "the single sentence waited for an expensive request to end"
    assert [answers[i][0] for i in range(2)] == [200, 200]
