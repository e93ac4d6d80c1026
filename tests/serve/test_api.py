"""`nmt serve`'s HTTP API in-process: answers identical to `nmt generate`, batching across concurrent
requests, and every bad request answered with a JSON error."""

import json
import math
import threading

import pytest

from tests.serve.serving import SENTENCES, generate_jsonl, serving

pytest.importorskip("starlette")
pytest.importorskip("httpx")


def test_answers_are_those_of_generate_byte_for_byte(trained_copy_checkpoint, tmp_path):
    expected = generate_jsonl(trained_copy_checkpoint, tmp_path, SENTENCES)
    nbest = generate_jsonl(trained_copy_checkpoint, tmp_path, SENTENCES, "--nbest", "3", "--lenpen", "1.0")
    with serving(trained_copy_checkpoint) as client:
        response = client.post("/translate", json={"texts": SENTENCES})
        asked = client.post("/translate", json={"texts": SENTENCES, "nbest": 3, "lenpen": 1})
        single = client.post("/translate", json={"text": SENTENCES[1]})
    assert response.status_code == 200, response.text
    got = response.json()["translations"]
    assert [t["text"] for t in got] == [r["hypotheses"][0]["text"] for r in expected]
    assert [t["score"] for t in got] == [r["hypotheses"][0]["score"] for r in expected]
    assert all("nbest" not in t for t in got)
    assert asked.status_code == 200, asked.text
    assert [t["nbest"] for t in asked.json()["translations"]] == [r["hypotheses"] for r in nbest]
    assert single.json()["translations"] == [got[1]]
    assert any(t["text"] for t in got)  # the trained model does translate


def test_concurrent_requests_are_batched_together_and_each_gets_its_own(trained_copy_checkpoint, tmp_path):
    expected = [r["hypotheses"][0]["text"] for r in generate_jsonl(trained_copy_checkpoint, tmp_path, SENTENCES)]
    answers = [None] * len(SENTENCES)
    with serving(trained_copy_checkpoint, max_wait=0.5) as client:
        barrier = threading.Barrier(len(SENTENCES))

        def ask(i):
            barrier.wait()
            answers[i] = client.post("/translate", json={"text": SENTENCES[i]}).json()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(SENTENCES))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        metrics = client.get("/metrics").text
    assert [a["translations"][0]["text"] for a in answers] == expected
    buckets = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("nmt_batch_requests_bucket"))
    # some batch held sentences of more than one request: fewer batches held one request than there were
    assert int(buckets['nmt_batch_requests_bucket{model="src-tgt",le="1"}']) < int(
        buckets['nmt_batch_requests_bucket{model="src-tgt",le="+Inf"}']
    )
    assert f'nmt_sentences_total{{model="src-tgt"}} {len(SENTENCES)}' in metrics
    assert f'nmt_requests_total{{code="200"}} {len(SENTENCES)}' in metrics


def test_health_ready_info_metrics_and_the_page(tiny_checkpoint):
    with serving(tiny_checkpoint) as client:
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/ready").json() == {"ready": True}
        info = client.get("/info").json()
        metrics = client.get("/metrics")
        page = client.get("/")
    assert (info["source_lang"], info["target_lang"], info["task"]) == ("src", "tgt", "translation")
    assert info["vocab_size"] == 24 and info["model"]["d_model"] > 0 and info["search"]["beam"] == 4
    assert info["checkpoint"].endswith("checkpoint_last.pt") and info["nmt_version"]
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    for name in ("nmt_requests_total", "nmt_queue_sentences", "nmt_batch_sentences", "nmt_request_seconds"):
        assert f"# TYPE {name} " in metrics.text
    assert 'nmt_request_seconds_bucket{model="src-tgt",le="+Inf"}' in metrics.text
    assert page.status_code == 200 and 'id="translate"' in page.text and 'id="source"' in page.text


def test_search_settings_default_to_the_servers_and_requests_override_them(trained_copy_checkpoint, tmp_path):
    expected = generate_jsonl(trained_copy_checkpoint, tmp_path, SENTENCES[:3], "--beam", "1")
    with serving(trained_copy_checkpoint, search={"beam": 1}) as client:
        greedy = client.post("/translate", json={"texts": SENTENCES[:3]}).json()["translations"]
        assert client.get("/info").json()["search"]["beam"] == 1
        refused = client.post("/translate", json={"text": "1 2", "nbest": 2})  # nbest 2 > the server's beam 1
        beam = client.post("/translate", json={"text": "1 2", "nbest": 2, "beam": 2})
    assert [t["text"] for t in greedy] == [r["hypotheses"][0]["text"] for r in expected]
    assert refused.status_code == 400 and "nbest 2 cannot exceed beam 1" in refused.json()["error"]
    assert beam.status_code == 200 and len(beam.json()["translations"][0]["nbest"]) == 2


BAD_REQUESTS = [
    (b'{"texts": ["1 2"', 400, "not valid JSON"),
    (b'{"text": "caf\xe9"}', 400, "not valid UTF-8"),
    (b'["1 2"]', 400, "must be a JSON object"),
    (b'{"texts": []}', 400, '"texts" is empty'),
    (b'{"texts": ["1", 2]}', 400, "list of strings"),
    (b'{"texts": ["1", null]}', 400, '"texts"[1] is null'),
    (b'{"texts": "1 2"}', 400, '"texts" must be a list of strings, not a string'),
    (b'{"text": 3}', 400, '"text" must be a string'),
    (b'{"text": ["1"]}', 400, '"text" must be a string, not an array'),
    (b"[" * 100_000, 400, "nests arrays or objects too deeply"),  # was a RecursionError: a plain-text 500
    (b'{"text": ' * 50_000 + b'"1"' + b"}" * 50_000, 400, "nests arrays or objects too deeply"),
    (b'{"text": "1", "lenpen": NaN}', 400, "NaN is not a JSON number"),
    (b'{"text": "1", "lenpen": -Infinity}', 400, "-Infinity is not a JSON number"),
    (b'{"text": "1", "beam": 1' + b"0" * 5000 + b"}", 400, "an integer of 5,001 digits"),  # was a 500 too
    (b'{"text": "1", "texts": ["2"]}', 400, 'either "text"'),
    (b"{}", 400, 'either "text"'),
    (b'{"text": "1", "beam": "4"}', 400, "'beam' must be int"),
    (b'{"text": "1", "beam": true}', 400, "'beam' must be int"),
    (b'{"text": "1", "lenpen": "x"}', 400, "'lenpen' must be a number"),
    (b'{"text": "1", "beam": 0}', 400, "beam 0 must be at least 1"),  # the request's field, not the CLI's --beam
    (b'{"text": "1", "beam": 1000000000}', 400, "beam 1000000000 is above this server's limit of 16 (--max-beam)"),
    (b'{"text": "1", "sampling": true, "nbest": 17}', 400, "nbest 17 is above this server's limit of 16"),
    (b'{"text": "1", "colour": 1}', 400, "unknown field 'colour'"),
    (b'{"text": "1", "seed": 3}', 400, "sampling is off, so seed would be ignored; add sampling or drop them"),
    (b'{"text": "1\\n2"}', 400, "line break"),
    (b'{"text": "\\ud800"}', 400, "unpaired surrogate"),
    (b'{"text": "\xe2\x96\x811 \xe2\x96\x812"}', 400, "sentencepiece pieces"),
    (json.dumps({"texts": ["1"] * 5}).encode(), 400, "--max-request-sentences"),
]


def test_bad_requests_get_a_json_error_naming_the_problem(tiny_checkpoint):
    with serving(tiny_checkpoint, max_request_sentences=4) as client:
        answers = [client.post("/translate", content=body) for body, _, _ in BAD_REQUESTS]
        missing = client.get("/nowhere")
        wrong_method = client.get("/translate")
        still_fine = client.post("/translate", json={"text": "1 2"})
        metrics = client.get("/metrics").text
    for (body, status, words), answer in zip(BAD_REQUESTS, answers):
        assert answer.status_code == status, (body, answer.text)
        assert words in answer.json()["error"], (body, answer.json())
    assert missing.status_code == 404 and "error" in missing.json()
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    assert still_fine.status_code == 200
    assert f'nmt_requests_total{{code="400"}} {len(BAD_REQUESTS)}' in metrics


def test_a_line_over_the_models_positions_is_truncated_with_a_warning(tiny_checkpoint):
    long_line = " ".join(["5"] * 400)  # transformer_tiny has 256 positions
    with serving(tiny_checkpoint) as client:
        answer = client.post("/translate", json={"texts": [long_line, "1 2"]}).json()["translations"]
    assert "truncated to 255" in answer[0]["warning"] and "warning" not in answer[1]


def test_a_full_queue_answers_503_and_a_late_request_504(tiny_checkpoint):
    with serving(tiny_checkpoint, max_queue=2, max_request_sentences=3) as client:
        full = client.post("/translate", json={"texts": ["1", "2", "3"]})
    # The timeout leaves the first request time to be answered on a loaded machine: timed out, it would not be
    # waited for, and the late request would run at once.
    with serving(tiny_checkpoint, max_wait=5.0, timeout=1.0) as client:
        first = client.post("/translate", json={"texts": ["1", "2", "3"]})  # a batch of 3: the next waits for 3
        late = client.post("/translate", json={"text": "1 2 3"})
        metrics = client.get("/metrics").text
    assert full.status_code == 503 and "queue" in full.json()["error"]
    assert first.status_code == 200
    assert late.status_code == 504 and "--timeout 1" in late.json()["error"]
    assert "nmt_queue_sentences 0" in metrics  # the late request's sentence left the queue with it


def test_without_the_serve_extra_the_command_names_it(monkeypatch, tiny_checkpoint):
    import importlib.util

    from click.testing import CliRunner

    from nmt_cli.cli import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    result = CliRunner().invoke(cli, ["serve", "--path", str(tiny_checkpoint)])
    assert result.exit_code == 1
    assert 'pip install "nmt[serve]"' in result.output and "uvicorn missing" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("cudnn", [False, True])
def test_the_server_sets_the_attention_backends_as_generate_does(tiny_checkpoint, cudnn):
    """cuDNN's attention plans every new shape, and every search step is one: on the first GPU run serve
    searched 10x slower than generate, which turns it off. The flags are process-wide (also set on the CPU)."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(not cudnn)
    try:
        with serving(tiny_checkpoint, cudnn_attention=cudnn):
            assert torch.backends.cuda.cudnn_sdp_enabled() is cudnn
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)  # PyTorch's default


def test_a_score_json_cannot_write_is_a_json_500_counted_in_metrics(tiny_checkpoint, monkeypatch):
    from nmt_cli.serve import batch_search

    with serving(tiny_checkpoint) as client:
        # lenpen -1e308 did this
        monkeypatch.setattr(batch_search, "translation", lambda hyps, nbest, vocab: {"text": "1", "score": -math.inf})
        answer = client.post("/translate", json={"text": "1 2"})
        metrics = client.get("/metrics").text
    assert answer.status_code == 500 and "cannot be written as JSON" in answer.json()["error"]
    assert 'nmt_requests_total{code="500"} 1' in metrics and 'code="200"' not in metrics
