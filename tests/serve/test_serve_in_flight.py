"""`nmt serve --fixed-slots --in-flight`: sentences queued while a batch searches join it in the slots its finished
sentences left (search/in_flight.py, through serve/batcher.py's Admission), are answered as they finish, and get
what generate gives them; sentences of their own rules (a prefix, constraints, an alignment) are not admitted;
--in-flight without --fixed-slots is refused in one line."""

import threading
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

import nmt_cli.search.in_flight as in_flight_module
from nmt_cli.cli import cli
from nmt_cli.config import ServeConfig
from nmt_cli.serve.models import Models, key_of
from nmt_cli.serve.queued import Admission
from tests.search.test_steps import counting
from tests.serve.serving import SENTENCES, generate_jsonl, serving

LONG = "1 2 3 4 5 6 7 8 9 1 2 3 4 5 6 7"  # the copy model answers each text in its own length


@pytest.fixture
def admitted(monkeypatch):
    """The sentences admitted into running batches, as lists of token ids, in order."""
    seen = []
    admit = in_flight_module.admit

    def recording(stepper, encode, sources, slots, cfg, max_positions):
        seen.extend(list(map(list, sources)))
        admit(stepper, encode, sources, slots, cfg, max_positions)

    monkeypatch.setattr(in_flight_module, "admit", recording)
    return seen


CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)


@pytest.fixture
def exact_fp32():
    """CUDA's matmuls in exact fp32 (no TF32) for the comparison, the captures included."""
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = allowed


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_queued_sentences_join_a_running_batch(trained_copy_checkpoint, admitted, device, exact_fp32):
    """Models.run with an Admission that hands over two sentences once the batch has stepped a few times: they are
    searched in the freed slots, told early, and returned after the batch's own, each as it is searched alone; a
    sentence with a prefix is never offered the slots. On CUDA (fp32) the steps are CUDA graphs."""
    cfg = ServeConfig(
        path=str(trained_copy_checkpoint), device=device, precision="fp32", threads=1, fixed_slots=True, in_flight=True
    )
    models = Models.open(cfg, {"beam": 3})
    served = models.default.served
    served.warm_up()
    assert served.in_flight and served.answers_early
    assert served.info["cuda_graphs"] is (device == "cuda")
    key = key_of(models.default, served.search)
    queue = served.prepare(["7 7", "2 4 6 8"])
    queue.insert(0, served.with_prefixes(served.prepare(["5 0 5"]), ["5"], served.search)[0])
    steps, told, offered = [0], [], []

    def take(free, slots, fits):
        offered.append(free)
        if steps[0] < 3:
            return []
        taken = [s for s in queue if fits(s)][:free]
        queue[:] = [s for s in queue if not any(s is t for t in taken)]
        return taken

    batch = served.prepare(["0", LONG])
    wanted = lambda: [True] * (len(batch) + len(admitted))  # noqa: E731  the batch's and those admitted so far
    search = models.run(key, batch, wanted, lambda i, r: told.append((i, r)), Admission(take, 0))
    results = counting(search, steps)
    assert len(queue) == 1 and queue[0].prefix is not None  # the prefixed one stays queued
    assert len(admitted) == 2 and sorted(i for i, _ in told) == [0, 1, 2, 3]
    got = dict(told)
    assert results == [got[0], got[1]]  # the batch's own returned too; the admitted ones told, not kept
    alone = [models.run(key, served.prepare([t]), lambda: [True], None) for t in ["0", LONG, "7 7", "2 4 6 8"]]
    want = [counting(a, [0])[0] for a in alone]
    assert [got[i]["text"] for i in range(4)] == [w["text"] for w in want]
    assert [got[i]["score"] for i in range(4)] == pytest.approx([w["score"] for w in want], abs=2e-4)  # to 1e-4
    assert offered[:2] == [0, 1]  # a bucket of 2 slots, full at first; "0" finished first and left its slot


def test_a_batch_that_cannot_take_sentences_says_so_at_once(trained_copy_checkpoint):
    """A batch answered at its end (a sentence asks for an alignment) or searched without fixed slots (sampling)
    declines at its start: one take of none, whose `fits` refuses every sentence, so the batcher starts others."""
    cfg = ServeConfig(path=str(trained_copy_checkpoint), device="cpu", threads=1, fixed_slots=True, in_flight=True)
    models = Models.open(cfg, {"beam": 3})
    served = models.default.served
    aligned = [replace(s, alignment="hard") for s in served.prepare(["1 2"])]
    sampled = replace(served.search, sampling=True)
    for search, batch in ((served.search, aligned), (sampled, served.prepare(["3 4"]))):
        calls = []

        def take(free, slots, fits):
            calls.append((free, slots, [fits(s) for s in served.prepare(["5", "6 7"])]))
            return []

        key = key_of(models.default, search)
        search_steps = models.run(key, batch, lambda: [True], lambda i, r: None, Admission(take, 4))
        next(search_steps)  # its first resumption
        assert calls == [(0, 0, [False, False])]
        counting(search_steps, [0])


def test_clients_served_in_flight_get_generates_answers(trained_copy_checkpoint, tmp_path, admitted):
    """Six clients, one sentence a request, back as soon as answered, beside a client of long sentences: every answer
    is generate's, and sentences joined running batches."""
    texts = [*SENTENCES[:6], LONG]
    records = generate_jsonl(trained_copy_checkpoint, tmp_path, texts, "--beam", "3")
    want = {text: r["hypotheses"][0]["text"] for text, r in zip(texts, records)}
    got, errors = [], []
    with serving(trained_copy_checkpoint, fixed_slots=True, in_flight=True, search={"beam": 3}) as client:

        def client_loop(mine):
            try:
                for _ in range(3):
                    for text in mine:
                        response = client.post("/translate", json={"text": text})
                        got.append((text, response.json()["translations"][0]["text"]))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=client_loop, args=([t],)) for t in texts[:6]]
        threads.append(threading.Thread(target=client_loop, args=([LONG, LONG],)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert len(got) == 6 * 3 + 6
    assert all(answer == want[text] for text, answer in got)
    assert admitted  # some sentence joined a running batch


def test_in_flight_needs_fixed_slots(trained_copy_checkpoint):
    result = CliRunner().invoke(cli, ["serve", "--path", str(trained_copy_checkpoint), "--in-flight"])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        "error: --in-flight admits sentences into fixed slots; give --fixed-slots with it"
    ]
