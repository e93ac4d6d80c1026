"""The batching core of `nmt serve` without HTTP or a model: a recording run function stands in for search."""

import threading
import time

import pytest

from nmt_cli.commands import serve as serve_command
from nmt_cli.errors import ConfigError
from nmt_cli.serve.batcher import Batcher
from nmt_cli.serve.queued import QueueFull, Stopping


class Recorder:
    """Runs a batch by echoing its items, and remembers every batch (key, items). The search takes `steps(key)`
    steps (by default 0: it runs whole in its first resumption) of `delay` seconds each, and `trace` records each
    step's key, in the order the worker ran them."""

    def __init__(self, delay=0.0, fail_on=None, steps=None):
        self.batches, self.trace, self.finished = [], [], []
        self.delay = delay
        self.fail_on = fail_on
        self.steps = steps or (lambda key: 0)
        self.running = self.most_running = 0

    def __call__(self, key, items, still_wanted=None, answer=None):
        self.batches.append((key, list(items)))
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError("boom")
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        time.sleep(self.delay)
        for _ in range(self.steps(key)):
            self.trace.append(key)
            yield
            time.sleep(self.delay)
        self.running -= 1
        self.finished.append(key)
        return [f"{key}:{item}" for item in items]


def submit(batcher, key, items, lengths=None):
    return batcher.submit(key, items, lengths or [len(i) for i in items])


def test_sentences_of_concurrent_requests_share_a_batch_and_come_back_in_order():
    run = Recorder()
    batcher = Batcher(run, max_tokens=1000, max_wait=0.3, max_queue=100)
    batcher.start()
    futures = [None] * 4
    barrier = threading.Barrier(4)

    def client(k):
        barrier.wait()
        futures[k] = submit(batcher, "cfg", [f"r{k}s{j}" for j in range(3)])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = [f.result(timeout=10) for f in futures]
    batcher.stop(timeout=10)
    assert results == [[f"cfg:r{k}s{j}" for j in range(3)] for k in range(4)]
    requests_per_batch = [len({item[:2] for item in items}) for _, items in run.batches]
    assert max(requests_per_batch) > 1


def test_a_batch_keeps_to_the_token_budget_and_to_one_search_setting():
    run = Recorder()
    batcher = Batcher(run, max_tokens=12, max_wait=0.2, max_queue=100)
    a = submit(batcher, "a", ["xx", "xxx", "x", "xxxxx", "xx"])
    b = submit(batcher, "b", ["yy", "y"])
    batcher.start()
    assert a.result(timeout=10) == ["a:xx", "a:xxx", "a:x", "a:xxxxx", "a:xx"]
    assert b.result(timeout=10) == ["b:yy", "b:y"]
    batcher.stop(timeout=10)
    for key, items in run.batches:
        assert len({item[0] for item in items}) == 1  # a's and b's never mixed
        assert len(items) * (max(map(len, items)) + 1) <= 12
    assert sorted(i for _, items in run.batches for i in items) == sorted(["xx", "xxx", "x", "xxxxx", "xx", "yy", "y"])


def test_the_oldest_sentence_waits_at_most_max_wait_for_company():
    run = Recorder()
    batcher = Batcher(run, max_tokens=10_000, max_wait=0.05, max_queue=100)
    batcher.start()
    start = time.monotonic()
    assert submit(batcher, "k", ["alone"]).result(timeout=5) == ["k:alone"]
    assert time.monotonic() - start < 2
    batcher.stop(timeout=5)


def test_a_full_queue_refuses_and_a_stopped_batcher_finishes_what_is_queued():
    run = Recorder(delay=0.01)
    batcher = Batcher(run, max_tokens=4, max_wait=10, max_queue=5)
    first = submit(batcher, "k", ["a", "b", "c"])
    with pytest.raises(QueueFull):
        submit(batcher, "k", ["d", "e", "f"])
    second = submit(batcher, "k", ["d", "e"])
    batcher.start()
    batcher.stop(timeout=10)  # does not wait the 10 s for company: stopping runs what is queued at once
    assert first.result(timeout=0) == ["k:a", "k:b", "k:c"] and second.result(timeout=0) == ["k:d", "k:e"]
    with pytest.raises(Stopping):
        submit(batcher, "k", ["g"])


def test_a_cancelled_request_no_longer_holds_room_in_the_queue():
    batcher = Batcher(Recorder(), max_tokens=4, max_wait=10, max_queue=5)  # not started: nothing leaves the queue
    timed_out = submit(batcher, "k", ["a", "b", "c", "d"])
    with pytest.raises(QueueFull, match="holds 4 sentences"):
        submit(batcher, "k", ["e", "f"])
    timed_out.cancel()  # what the server does on 504 or when the client goes away
    assert batcher.queue_length == 0
    accepted = submit(batcher, "k", ["e", "f", "g", "h", "i"])
    batcher.start()
    batcher.stop(timeout=10)
    assert accepted.result(timeout=0) == ["k:e", "k:f", "k:g", "k:h", "k:i"]


def test_a_cancelled_request_loses_its_queued_sentences():
    run = Recorder()
    batcher = Batcher(run, max_tokens=1000, max_wait=0.2, max_queue=100)
    gone = submit(batcher, "k", ["gone1", "gone2"])
    kept = submit(batcher, "k", ["kept"])
    assert gone.cancel()
    batcher.start()
    assert kept.result(timeout=10) == ["k:kept"]
    batcher.stop(timeout=10)
    assert all("gone" not in item for _, items in run.batches for item in items)


def test_a_failing_batch_fails_its_requests_and_the_worker_goes_on():
    run = Recorder(fail_on="bad")
    batcher = Batcher(run, max_tokens=1000, max_wait=0.0, max_queue=100)
    batcher.start()
    with pytest.raises(RuntimeError, match="boom"):
        submit(batcher, "k", ["bad"]).result(timeout=10)
    assert submit(batcher, "k", ["good"]).result(timeout=10) == ["k:good"]
    batcher.stop(timeout=10)


def test_empty_sentences_ride_along_without_taking_the_budget():
    run = Recorder()
    batcher = Batcher(run, max_tokens=4, max_wait=0.1, max_queue=100)
    future = batcher.submit("k", ["", "abc", ""], [0, 3, 0])
    batcher.start()
    assert future.result(timeout=10) == ["k:", "k:abc", "k:"]
    batcher.stop(timeout=10)
    assert len(run.batches) == 1


def test_ready_is_set_after_the_warm_up_runs_in_the_worker():
    seen = []
    batcher = Batcher(
        Recorder(),
        max_tokens=10,
        max_wait=0,
        max_queue=10,
        warm_up=lambda: seen.append(threading.current_thread().name),
    )
    assert not batcher.ready.is_set()
    batcher.start()
    assert batcher.ready.wait(5) and seen == ["nmt-serve-worker"]
    batcher.stop(timeout=5)


@pytest.mark.parametrize(
    "failure, says",
    [
        (ConfigError("--quantize int8 runs on the CPU in fp32"), "--quantize int8 runs on the CPU in fp32"),
        (RuntimeError("cannot allocate"), "failed to translate a warm-up sentence with these options: RuntimeError"),
    ],
)
def test_a_failed_warm_up_is_refused_at_start_in_one_error(failure, says):
    def warm_up():
        raise failure

    batcher = Batcher(Recorder(), max_tokens=10, max_wait=0, max_queue=10, warm_up=warm_up)
    with pytest.raises(ConfigError, match=says):
        serve_command.warm_up(batcher)  # `nmt serve` waits for the warm-up before it listens
    assert batcher.warmed.is_set() and not batcher.ready.is_set() and batcher.warm_up_error is failure
    assert not batcher.running


def test_hurry_runs_sentences_waiting_for_company_at_once():
    run = Recorder()
    batcher = Batcher(run, max_tokens=1000, max_wait=60, max_queue=100)
    batcher.start()
    assert submit(batcher, "cfg", ["a", "b", "c"]).result(5)  # a batch of 3: the next waits for 3 sentences
    waiting = submit(batcher, "cfg", ["d"])
    time.sleep(0.1)
    assert not waiting.done()
    batcher.hurry()  # the server drains: no company will come
    assert waiting.result(5) == ["cfg:d"]
    batcher.stop(timeout=5)


def test_sentences_that_queued_during_a_batch_wait_for_the_clients_it_answers():
    """A client answered by a batch sends its next sentence moments later; the sentences that queued while the
    batch ran wait max_wait from its end for them, so the cohorts merge instead of alternating in small batches."""
    run = Recorder(delay=0.3)
    batcher = Batcher(run, max_tokens=1000, max_wait=0.1, max_queue=100)
    batcher.start()
    first = submit(batcher, "cfg", ["a1"])  # runs from 0.1 s to 0.4 s
    time.sleep(0.2)  # b1 queues while a1's batch runs, and is past its own max_wait when that batch ends
    second = submit(batcher, "cfg", ["b1"])
    assert first.result(timeout=10) == ["cfg:a1"]
    time.sleep(0.03)  # the answered client's next sentence, within max_wait of the batch's end
    third = submit(batcher, "cfg", ["a2"])
    assert second.result(timeout=10) == ["cfg:b1"] and third.result(timeout=10) == ["cfg:a2"]
    batcher.stop(timeout=10)
    assert [items for _, items in run.batches] == [["a1"], ["b1", "a2"]]


def test_a_lone_client_is_not_kept_waiting_for_company():
    """One client in a loop: the last batch answered it alone, so its next sentence runs at once (before, each
    waited for company that never came, up to max_wait from the end of the last batch)."""
    run = Recorder()
    batcher = Batcher(run, max_tokens=1000, max_wait=1.0, max_queue=100)
    batcher.start()
    start = time.monotonic()
    for i in range(3):
        assert submit(batcher, "cfg", [f"s{i}"]).result(timeout=10) == [f"cfg:s{i}"]
    assert time.monotonic() - start < 1.0
    batcher.stop(timeout=10)


def test_a_client_back_before_the_worker_counts_its_company_is_not_counted_twice():
    """The client resubmits from its future's callback, that is before the worker has moved on from answering
    it: the company the next batch waits for is still one sentence, not two (before, each request after the
    first waited max_wait for a second sentence that never came)."""
    batcher = Batcher(Recorder(), max_tokens=1000, max_wait=0.5, max_queue=100)
    done = threading.Event()
    answers = []

    def again(future):
        answers.append(future.result())
        if len(answers) < 4:
            submit(batcher, "cfg", [f"s{len(answers)}"]).add_done_callback(again)
        else:
            done.set()

    batcher.start()
    start = time.monotonic()
    submit(batcher, "cfg", ["s0"]).add_done_callback(again)
    assert done.wait(timeout=10)
    assert answers == [[f"cfg:s{i}"] for i in range(4)]
    assert time.monotonic() - start < 0.4  # three waits of max_wait took 1.5 s
    batcher.stop(timeout=10)


def test_once_the_clients_of_the_last_batch_are_back_the_batch_runs_without_waiting_longer():
    run = Recorder(delay=0.05)
    batcher = Batcher(run, max_tokens=1000, max_wait=2.0, max_queue=100)
    first = [submit(batcher, "cfg", [c + "1"]) for c in "xyz"]
    batcher.start()
    assert [f.result(timeout=10) for f in first] == [["cfg:x1"], ["cfg:y1"], ["cfg:z1"]]
    start = time.monotonic()
    second = [submit(batcher, "cfg", [c + "2"]) for c in "xy"]
    time.sleep(0.2)
    assert not any(f.done() for f in second)  # z's sentence is still expected
    second.append(submit(batcher, "cfg", ["z2"]))
    assert [f.result(timeout=10) for f in second] == [["cfg:x2"], ["cfg:y2"], ["cfg:z2"]]
    assert time.monotonic() - start < 1.5  # not max_wait (2 s)
    batcher.stop(timeout=10)
    assert [items for _, items in run.batches] == [["x1", "y1", "z1"], ["x2", "y2", "z2"]]


def test_a_batch_is_counted_before_its_answers_go_out():
    """A client that reads /metrics once answered finds its batch counted (bench_serve.py takes what one
    client's search cost from it)."""
    counted, seen_when_answered = [], []
    batcher = Batcher(Recorder(), max_tokens=1000, max_wait=0.0, max_queue=100, on_batch=lambda *b: counted.append(b))
    future = submit(batcher, "cfg", ["a"])
    future.add_done_callback(lambda f: seen_when_answered.append(len(counted)))  # in the worker, as answered
    batcher.start()
    assert future.result(timeout=10) == ["cfg:a"]
    batcher.stop(timeout=10)
    assert seen_when_answered and seen_when_answered[0] >= 1


def test_a_short_batch_admitted_while_a_long_one_runs_finishes_first():
    """A batch that arrives while an expensive one is searched is taken at the next step and, costing its client
    the least, searched until it ends: it is answered while the expensive one still runs, which then ends."""
    run = Recorder(delay=0.005, steps=lambda key: 400 if key == "long" else 3)
    costs = {"long": 400, "short": 3}
    batcher = Batcher(run, max_tokens=1000, max_wait=0.0, max_queue=100, cost=lambda key, n: costs[key])
    batcher.start()
    long = submit(batcher, "long", ["x"])
    time.sleep(0.1)
    start = time.monotonic()
    assert submit(batcher, "short", ["y"]).result(timeout=5) == ["short:y"]
    assert time.monotonic() - start < 0.5  # 3 steps of 5 ms (the long one's 400 take 2 s)
    assert not long.done()
    assert long.result(timeout=10) == ["long:x"]
    batcher.stop(timeout=10)
    assert run.finished == ["short", "long"]
    after = run.trace.index("short")
    assert run.trace[after : after + 3] == ["short"] * 3  # no step of the long one between the short one's


def test_at_most_two_batches_run_at_once_and_each_ends():
    run = Recorder(delay=0.002, steps=lambda key: 30)
    costs = {"a": 100, "b": 10, "c": 10, "d": 10}  # b, c and d pass a (costing 20 and more), one at a time
    batcher = Batcher(run, max_tokens=1000, max_wait=0.0, max_queue=100, cost=lambda key, n: costs[key])
    futures = [submit(batcher, key, ["x"]) for key in "abcd"]  # one batch per key: four ready at once
    batcher.start()
    assert [f.result(timeout=10) for f in futures] == [[f"{key}:x"] for key in "abcd"]
    batcher.stop(timeout=10)
    assert run.most_running == 2
    assert run.finished == ["b", "c", "d", "a"]  # the cheapest per client first


def test_the_batch_that_costs_least_per_request_steps_next_then_the_one_that_has_run_the_fewest_steps():
    from nmt_cli.serve.policy import BatchPolicy
    from nmt_cli.serve.queued import Job, Queued, Running

    def running(requests, steps):
        """A batch of requests, each a list of its sentences' costs, that has run `steps` steps."""
        jobs = [Job("k", ["x"] * len(costs)) for costs in requests]
        r = Running(
            [Queued(job, i, 1, cost) for job, costs in zip(jobs, requests) for i, cost in enumerate(costs)], iter(())
        )
        r.steps = steps
        return r

    big, light, lighter = running([[2056]], 3), running([[120]] * 4, 30), running([[100, 100]], 50)
    assert lighter.share == 200 and light.share == 120 and big.share == 2056  # tokens per request
    assert BatchPolicy.choose([big, light, lighter]) is light
    ran_less = running([[120]] * 4, 10)
    assert BatchPolicy.choose([light, ran_less]) is ran_less and BatchPolicy.choose([big, ran_less]) is ran_less


def test_a_batch_that_fails_beside_a_running_one_fails_only_its_own_requests():
    run = Recorder(delay=0.005, fail_on="bad", steps=lambda key: 40 if key == "long" else 2)
    costs = {"long": 40, "other": 2}
    batcher = Batcher(run, max_tokens=1000, max_wait=0.0, max_queue=100, cost=lambda key, n: costs[key])
    batcher.start()
    long = submit(batcher, "long", ["x"])
    time.sleep(0.05)
    with pytest.raises(RuntimeError, match="boom"):
        submit(batcher, "other", ["bad"]).result(timeout=5)
    assert not long.done()
    assert submit(batcher, "other", ["good"]).result(timeout=5) == ["other:good"]
    assert long.result(timeout=10) == ["long:x"]
    batcher.stop(timeout=10)


def test_a_batch_of_the_usual_length_is_not_joined_by_the_next_one():
    """Sentences that arrive while a batch of the usual length runs wait for its end and batch together, as with
    one slot; beside a batch of the usual length a second one would split every later batch in two."""
    run = Recorder(delay=0.01, steps=lambda key: 4)
    batcher = Batcher(run, max_tokens=1000, max_wait=0.0, max_queue=100)
    batcher.start()
    assert submit(batcher, "k", ["first"]).result(timeout=5) == ["k:first"]  # the usual: 4 steps
    running = submit(batcher, "k", ["a"])
    time.sleep(0.015)  # it has started
    late = [submit(batcher, "k", [w]) for w in ("b", "c")]
    assert running.result(timeout=5) == ["k:a"] and [f.result(timeout=5) for f in late] == [["k:b"], ["k:c"]]
    batcher.stop(timeout=5)
    assert [items for _, items in run.batches] == [["first"], ["a"], ["b", "c"]]
    assert run.most_running == 1


def test_a_batch_that_may_end_sooner_starts_at_once_and_runs_first():
    """With costs (a sentence's rows at each step of its longest output, known before the search): a batch that
    costs its client less than half of what the running one costs its own starts beside it at once and runs first,
    without waiting for the running one to end."""
    run = Recorder(delay=0.002, steps=lambda key: {"usual": 2, "long": 30, "short": 3}[key])
    bounds = {"usual": 3, "long": 40, "short": 4}
    batcher = Batcher(run, max_tokens=1000, max_wait=0.0, max_queue=100, cost=lambda key, n: bounds[key])
    batcher.start()
    assert submit(batcher, "usual", ["x"]).result(timeout=5) == ["usual:x"]  # the usual batch: 2 steps
    long = submit(batcher, "long", ["x"])
    while run.trace.count("long") < 2:  # running
        time.sleep(0.001)
    short = submit(batcher, "short", ["x"])
    assert short.result(timeout=5) == ["short:x"] and not long.done()
    assert long.result(timeout=5) == ["long:x"]
    batcher.stop(timeout=5)
    first_short = run.trace.index("short")
    assert run.trace[first_short : first_short + 3] == ["short"] * 3  # ran first, without a long step between
    assert run.trace.index("short") <= 5  # started at once, the long batch at its 2nd or 3rd step


def test_a_request_larger_than_a_batch_leaves_the_second_slot_to_others():
    """A request of two batches searches them one after the other: its second never starts beside its first, so a
    short request arriving meanwhile takes the free slot at once (it had waited for one of the two to end)."""
    run = Recorder(delay=0.005, steps=lambda key: 40 if key == "long" else 3)
    bounds = {"long": 50, "short": 4}
    batcher = Batcher(run, max_tokens=10, max_wait=0.0, max_queue=100, cost=lambda key, n: bounds[key])
    batcher.start()
    long = submit(batcher, "long", ["aaaa"] * 4)  # 2 sentences of 4 pieces and EOS a batch: two batches
    while run.trace.count("long") < 3:
        time.sleep(0.001)
    assert submit(batcher, "short", ["y"]).result(timeout=5) == ["short:y"]
    assert not long.done() and [key for key, _ in run.batches] == ["long", "short"]
    assert long.result(timeout=10) == ["long:aaaa"] * 4
    batcher.stop(timeout=10)
    assert [key for key, _ in run.batches] == ["long", "short", "long"] and run.finished == ["short", "long", "long"]


def test_clients_coming_back_one_after_another_past_max_wait_still_batch_together():
    """The clients a batch answered come back one after another (on a few cores the event loop answers and reads
    them in turn); while they keep coming within max_wait of each other they are waited for, up to a share of a
    usual batch's time, instead of the first of them running as a batch of their own and splitting the next."""
    run = Recorder(delay=1.0)  # a batch's search: 1 s, so they may be waited for up to 0.25 s
    batcher = Batcher(run, max_tokens=1000, max_wait=0.1, max_queue=100)
    first = [submit(batcher, "cfg", [c + "1"]) for c in "wxyz"]
    batcher.start()
    assert [f.result(timeout=10) for f in first] == [["cfg:w1"], ["cfg:x1"], ["cfg:y1"], ["cfg:z1"]]
    second = []
    for c in "wxyz":  # 0.15 s from the first to the last: past max_wait
        second.append(submit(batcher, "cfg", [c + "2"]))
        time.sleep(0.05)
    assert [f.result(timeout=10) for f in second] == [["cfg:w2"], ["cfg:x2"], ["cfg:y2"], ["cfg:z2"]]
    batcher.stop(timeout=10)
    assert [items for _, items in run.batches] == [["w1", "x1", "y1", "z1"], ["w2", "x2", "y2", "z2"]]


def test_company_is_waited_for_no_longer_than_a_share_of_a_usual_batch():
    """A client that keeps sending while the others do not come back does not hold the batch beyond the bound:
    the oldest of its sentences runs within a quarter of a usual batch's time after the last batch's end."""
    run = Recorder(delay=0.4)  # waited for up to 0.1 s
    batcher = Batcher(run, max_tokens=1000, max_wait=0.08, max_queue=100)
    first = [submit(batcher, "cfg", [c + "1"]) for c in "xyz"]  # three clients; only x comes back, often
    batcher.start()
    assert [f.result(timeout=10) for f in first] == [["cfg:x1"], ["cfg:y1"], ["cfg:z1"]]
    again = submit(batcher, "cfg", ["x2"])
    for i in range(6):  # another sentence every 0.05 s for 0.3 s: the wait ends at its bound, not with them
        time.sleep(0.05)
        submit(batcher, "cfg", [f"x{i + 3}"])
    assert again.result(timeout=10) == ["cfg:x2"]
    batcher.stop(timeout=10)
    assert len(run.batches[1][1]) < 5, run.batches  # 0.1 s of sentences arriving every 0.05 s, not all six


def test_the_sentences_of_a_cancelled_request_are_not_waited_for():
    """A request that timed out while its batch ran does not come back at once: the next batch does not wait for
    it (before, its sentences counted as company the next batch waited max_wait for)."""
    run = Recorder(delay=0.05, steps=lambda key: 4)
    batcher = Batcher(run, max_tokens=1000, max_wait=2.0, max_queue=100)
    timed_out, answered = submit(batcher, "cfg", ["t1"]), submit(batcher, "cfg", ["a1"])
    batcher.start()
    time.sleep(0.1)  # their batch runs 0.25 s
    timed_out.cancel()
    assert answered.result(timeout=10) == ["cfg:a1"]
    start = time.monotonic()
    assert submit(batcher, "cfg", ["a2"]).result(timeout=10) == ["cfg:a2"]
    assert time.monotonic() - start < 1.0  # not max_wait (2 s)
    batcher.stop(timeout=10)


def test_a_batch_nobody_waits_for_leaves_the_company_the_next_batch_waits_for():
    """Two batches ran side by side: the one answered expects its 20 clients back; the other, whose requests all
    went away (timed out, client gone), ends after it and must not make the next request start alone."""
    from nmt_cli.serve.policy import BatchPolicy
    from nmt_cli.serve.queued import Job, Queued, Running

    def ended(job, n):
        return Running([Queued(job, i, 1) for i in range(n)], iter(()))

    policy = BatchPolicy(max_tokens=1000, max_wait=0.05)
    answered, gone = Job("cfg", ["a"] * 20), Job("cfg", ["b"] * 20)
    gone.future.cancel()
    policy.ended(ended(answered, 20), searched=True)
    assert policy.expected == 20
    policy.ended(ended(gone, 20), searched=True)
    assert policy.expected == 20
    policy.ended(ended(Job("cfg", ["c"] * 3), 3), searched=True)  # a batch answered sets it anew
    assert policy.expected == 3


def test_a_sentence_answered_early_answers_its_request_while_the_batch_runs():
    """A search that has a sentence's result before its batch ends (`answer`) answers that request at once; a
    request of several sentences waits for its last, and the batch's end does not answer anyone twice."""
    release = threading.Event()

    def run(key, items, still_wanted, answer):
        answer(items.index("short"), "early:short")
        answer(items.index("x1"), "early:x1")
        while not release.is_set():  # the long sentence's steps, until the test has looked
            time.sleep(0.005)
            yield
        return [f"end:{item}" for item in items]

    batcher = Batcher(run, max_tokens=1000, max_wait=0.05, max_queue=100)
    batcher.start()
    short, pair, long = submit(batcher, "k", ["short"]), submit(batcher, "k", ["x1", "x2"]), submit(batcher, "k", ["y"])
    assert short.result(timeout=5) == ["early:short"]
    time.sleep(0.05)
    assert not pair.done() and not long.done()
    release.set()
    assert pair.result(timeout=5) == ["early:x1", "end:x2"] and long.result(timeout=5) == ["end:y"]
    batcher.stop(timeout=5)


def test_clients_answered_early_are_expected_back_until_they_are():
    """A batch that answered two of its three one-sentence requests early expects three sentences back when it ends:
    the two answered early are counted until as many sentences have arrived since the first early answer."""
    from nmt_cli.serve.queued import Job, Queued, Running

    def batch_of_three(batcher):
        jobs = [Job("cfg", ["a"], results=[None], remaining=1) for _ in range(3)]
        running = Running([Queued(job, 0, 1) for job in jobs], iter(()))
        for i in (0, 1):
            batcher._early(running, i, "early")
        return running

    away = Batcher(Recorder(), max_tokens=1000, max_wait=0.05, max_queue=100)
    away.policy.ended(batch_of_three(away), searched=True)
    assert away.policy.expected == 3  # none of the two is back yet
    back = Batcher(Recorder(), max_tokens=1000, max_wait=0.05, max_queue=100)
    running = batch_of_three(back)
    submit(back, "cfg", ["b"]), submit(back, "cfg", ["c"])  # the two come back before the batch ends
    back.policy.ended(running, searched=True)
    assert back.policy.expected == 3  # the one answered at the end, and the two queued


def test_a_batch_none_waits_for_is_dropped_even_by_a_search_that_never_asks():
    """A running batch whose requests are all gone leaves the worker at once, whether or not its search asks
    still_wanted (a batch the others' shorter searches starve would never get the step that asks)."""
    run = Recorder(delay=0.01, steps=lambda key: 1000 if key == "big" else 1)
    batcher = Batcher(run, max_tokens=1000, max_wait=0.0, max_queue=100)
    big = submit(batcher, "big", ["a"])
    batcher.start()
    time.sleep(0.05)
    big.cancel()
    start = time.perf_counter()
    assert submit(batcher, "k", ["b"]).result(timeout=5) == ["k:b"]
    assert time.perf_counter() - start < 5.0 and not batcher._running  # not the 10 s of its 1,000 steps
    batcher.stop(timeout=5)
    assert "big" not in run.finished
