"""`nmt serve --fixed-slots [--no-cuda-graphs]`: served batches searched over fixed slots (search/slots.py) answer as
generate answers, with and without --fixed-slots, early answers included; the requests the slot search does not run
(prefixes, constraints, the n-gram ban, sampling, beam 1) keep the default search, as in generate; with the
captured-step bookkeeping (search/graphs.py; a capture that runs the step eagerly on the CPU, CUDA graphs on a GPU)
two batches stepped in turn by the worker each hold a capture of their own."""

import pytest
import torch
from click.testing import CliRunner

from nmt_cli.cli import cli
from nmt_cli.config import ServeConfig
from nmt_cli.serve.models import Models, key_of
from nmt_cli.steps import run_to_end
from tests.search.test_steps import counting, in_turn
from tests.serve.serving import SENTENCES, generate_jsonl, serving


def answers(response):
    assert response.status_code == 200, response.text
    return [(t["text"], [(h["text"], h["score"]) for h in t["nbest"]]) for t in response.json()["translations"]]


def generated(records):
    return [(r["hypotheses"][0]["text"], [(h["text"], h["score"]) for h in r["hypotheses"]]) for r in records]


def assert_same(want, got):
    assert [text for text, _ in got] == [text for text, _ in want]
    assert [[t for t, _ in nbest] for _, nbest in got] == [[t for t, _ in nbest] for _, nbest in want]
    assert [s for _, nbest in got for _, s in nbest] == pytest.approx(
        [s for _, nbest in want for _, s in nbest], abs=1e-3
    )


def test_served_answers_over_fixed_slots_are_generates(trained_copy_checkpoint, tmp_path, slot_steps_taken):
    extra = ("--beam", "3", "--nbest", "2")
    default = generated(generate_jsonl(trained_copy_checkpoint, tmp_path, SENTENCES, *extra))
    fixed = generated(generate_jsonl(trained_copy_checkpoint, tmp_path, SENTENCES, *extra, "--fixed-slots"))
    assert_same(default, fixed)
    slot_steps_taken.clear()
    with serving(trained_copy_checkpoint, fixed_slots=True, search={"beam": 3, "nbest": 2}) as client:
        info = client.get("/info").json()
        assert info["fixed_slots"] is True and info["cuda_graphs"] is False  # no CUDA: no graphs
        slot_steps_taken.clear()  # the warm-up's
        assert_same(fixed, answers(client.post("/translate", json={"texts": SENTENCES})))
        assert slot_steps_taken  # the slot search ran the batch
    with serving(trained_copy_checkpoint) as client:
        assert client.get("/info").json()["fixed_slots"] is False  # off unless asked


def test_requests_the_slot_search_does_not_run_keep_the_default_search(trained_copy_checkpoint, slot_steps_taken):
    """Per request, as generate per option: a prefix, constraints, the n-gram ban, sampling and beam 1 answer what a
    server without --fixed-slots answers, without a fixed-slot step."""
    texts = SENTENCES[:4]
    requests = [
        {"texts": texts, "prefix": ["1", "", "", "9"]},
        {"texts": texts, "constraints": [["2"], [], [], []]},
        {"texts": texts, "no_repeat_ngram_size": 2},
        {"texts": texts, "sampling": True, "seed": 3},
        {"texts": texts, "beam": 1},
    ]
    with serving(trained_copy_checkpoint) as client:
        want = [client.post("/translate", json=r).json()["translations"] for r in requests]
    with serving(trained_copy_checkpoint, fixed_slots=True) as client:
        slot_steps_taken.clear()
        got = [client.post("/translate", json=r).json()["translations"] for r in requests]
        assert slot_steps_taken == []
        client.post("/translate", json={"texts": texts})
        assert slot_steps_taken  # a plain request's batch runs over the slots
    assert [[t["text"] for t in ts] for ts in got] == [[t["text"] for t in ts] for ts in want]


def served_models(ckpt):
    """The Models of `nmt serve --fixed-slots`, warm (on the CPU: the captured step run without graphs)."""
    models = Models.open(ServeConfig(path=str(ckpt), device="cpu", threads=1, fixed_slots=True), {})
    served = models.default.served
    served.warm_up()
    assert served.searcher.translator.slots is served.searcher.inference.slots
    return models, served


def test_early_answers_over_fixed_slots(trained_copy_checkpoint, slot_steps_taken):
    """`answers_early` (a GPU's; forced here): the short sentence of a batch searched over fixed slots is answered
    before the long one's steps end, with the result the batch returns, which is the default search's."""
    texts = ["0", "1 2 3 4 5 6 7 8 9 1 2 3 4 5 6 7", "3 1"]  # the copy model answers each in its own length
    plain = Models.open(ServeConfig(path=str(trained_copy_checkpoint), device="cpu", threads=1), {})
    plain_served = plain.default.served
    want = run_to_end(
        plain.run(key_of(plain.default, plain_served.search), plain_served.reader.prepare(texts), None, None)
    )
    models, served = served_models(trained_copy_checkpoint)
    served.searcher.answers_early = True
    key, told, steps = key_of(models.default, served.search), [], [0]
    slot_steps_taken.clear()
    search = models.run(
        key, served.reader.prepare(texts), lambda: [True] * 3, lambda i, r: told.append((i, steps[0], r))
    )
    results = counting(search, steps)
    assert slot_steps_taken and results == want
    assert sorted(i for i, _, _ in told) == [0, 2] and all(r == results[i] for i, _, r in told)
    assert told[0][0] == 0 and told[0][1] < steps[0]  # the one-digit text, before the long one's steps end


def test_two_batches_stepped_in_turn_hold_captures_of_their_own(trained_copy_checkpoint):
    """The worker steps two batches in turn (serve/batcher.py): with graphs, two batches of one bucket each load
    their state into a capture of their own, and both answer as they do alone."""
    models, served = served_models(trained_copy_checkpoint)
    key = key_of(models.default, served.search)
    batches = [SENTENCES[:4], SENTENCES[4:]]
    alone = [run_to_end(models.run(key, served.reader.prepare(b), lambda: [True] * 4, None)) for b in batches]
    n_captures = served.searcher.inference.slots.graphs.n_captures
    runs = [models.run(key, served.reader.prepare(b), lambda: [True] * 4, None) for b in batches]
    results, _ = in_turn(*runs)
    assert results == alone
    assert served.searcher.inference.slots.graphs.n_captures > n_captures  # the second batch's own
    assert not any(c.held for copies in served.searcher.inference.slots.graphs.graphs.values() for c in copies)


def test_the_cli_takes_generates_flags():
    for command in ("serve", "generate"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert result.exit_code == 0
        assert "--fixed-slots" in result.output and "--cuda-graphs / --no-cuda-graphs" in result.output, command


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_serve_what_the_default_search_serves(trained_copy_checkpoint):
    """On CUDA, fp32: a server with --fixed-slots captures its steps as CUDA graphs and answers two batches stepped
    in turn, early answers included, as the default search does (each batch holding a capture of its own)."""
    cuda = {"path": str(trained_copy_checkpoint), "device": "cuda", "precision": "fp32"}
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 for the comparison, the warm-up's captures included
    try:
        plain = Models.open(ServeConfig(**cuda), {})
        models = Models.open(ServeConfig(**cuda, fixed_slots=True), {})
        served = models.default.served
        assert served.info["cuda_graphs"] is True and served.searcher.answers_early
        plain.default.served.warm_up()
        served.warm_up()
        n_captures = served.searcher.inference.slots.graphs.n_captures
        batches = [SENTENCES[:4], SENTENCES[4:]]
        runs = [
            m.run(
                key_of(m.default, m.default.served.search), m.default.served.reader.prepare(b), lambda: [True] * 4, told
            )
            for m, told in ((plain, None), (models, lambda i, r: None))
            for b in batches
        ]
        want, _ = in_turn(*runs[:2])
        got, _ = in_turn(*runs[2:])
        assert [[a["text"] for a in batch] for batch in got] == [[a["text"] for a in batch] for batch in want]
        assert (
            served.searcher.inference.slots.graphs.n_captures >= n_captures + 2
        )  # a bucket's capture for each of the two batches
    finally:
        torch.backends.cuda.matmul.allow_tf32 = True
