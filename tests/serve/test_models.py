"""Several checkpoints in one server (`--path [NAME=]CKPT` repeated): one batcher for all, a request picks its model
by name (ours) or by language pair (LibreTranslate's), and /info, /languages and /openapi.json list them."""

from dataclasses import replace

import pytest

from nmt_cli.config import ServeConfig
from nmt_cli.errors import ConfigError
from nmt_cli.serve.models import Models, split_path
from tests.serve.serving import SENTENCES, generate_jsonl, relabeled, serving
from tests.serve.test_signals import post, start_server, wait_ready


@pytest.fixture(scope="module")
def second_models(tiny_checkpoint, tmp_path_factory):
    """The tiny (barely trained) checkpoint as de-en and as src-en: other answers than the trained src-tgt one's."""
    root = tmp_path_factory.mktemp("models")
    return relabeled(tiny_checkpoint, root / "de_en.pt", "de", "en"), relabeled(
        tiny_checkpoint, root / "src_en.pt", "src", "en"
    )


def three(trained_copy_checkpoint, second_models, **kw):
    de_en, src_en = second_models
    return serving(trained_copy_checkpoint, more_paths=(str(de_en), f"other={src_en}"), **kw)


def texts_of(response):
    assert response.status_code == 200, response.text
    return [t["text"] for t in response.json()["translations"]]


def test_each_request_is_answered_by_its_model_as_generate_answers(trained_copy_checkpoint, second_models, tmp_path):
    de_en, _ = second_models
    copy = [r["hypotheses"][0]["text"] for r in generate_jsonl(trained_copy_checkpoint, tmp_path, SENTENCES)]
    tiny = [r["hypotheses"][0]["text"] for r in generate_jsonl(de_en, tmp_path, SENTENCES)]
    assert copy != tiny  # else the test could not tell the models apart
    with three(trained_copy_checkpoint, second_models) as client:
        assert texts_of(client.post("/translate", json={"texts": SENTENCES})) == copy  # the first --path
        assert texts_of(client.post("/translate", json={"texts": SENTENCES, "model": "src-tgt"})) == copy
        assert texts_of(client.post("/translate", json={"texts": SENTENCES, "model": "de-en"})) == tiny
        assert texts_of(client.post("/translate", json={"texts": SENTENCES, "model": "other", "beam": 2})) == [
            r["hypotheses"][0]["text"] for r in generate_jsonl(de_en, tmp_path, SENTENCES, "--beam", "2")
        ]
        unknown = client.post("/translate", json={"text": "1", "model": "fr-en"})
        not_a_name = client.post("/translate", json={"text": "1", "model": 3})
        metrics = client.get("/metrics").text
    assert unknown.status_code == not_a_name.status_code == 400
    # /metrics counts each model's own: its sentences, batches and answered requests
    n = len(SENTENCES)
    for name, requests in (("src-tgt", 2), ("de-en", 1), ("other", 1)):
        assert f'nmt_sentences_total{{model="{name}"}} {requests * n}' in metrics, metrics
        assert f'nmt_batch_sentences_sum{{model="{name}"}} {requests * n}' in metrics, metrics
        assert f'nmt_request_seconds_count{{model="{name}"}} {requests}' in metrics, metrics
    assert 'nmt_requests_total{code="400"} 2' in metrics
    assert unknown.json()["error"] == "\"model\" is 'fr-en'; this server serves 'src-tgt', 'de-en', 'other'"
    assert not_a_name.json()["error"].startswith('"model" is 3; this server serves')


def test_info_lists_the_models_and_gives_each_ones_own(trained_copy_checkpoint, second_models):
    de_en, src_en = second_models
    with three(trained_copy_checkpoint, second_models, search={"beam": 3}) as client:
        info = client.get("/info").json()
        other = client.get("/info", params={"model": "other"}).json()
        unknown = client.get("/info", params={"model": "nope"})
    assert info["source_lang"] == "src" and info["search"]["beam"] == 3  # the default model's, as with one
    assert info["models"] == [
        {"name": "src-tgt", "source_lang": "src", "target_lang": "tgt", "task": "translation",
         "checkpoint": str(trained_copy_checkpoint.resolve())},
        {"name": "de-en", "source_lang": "de", "target_lang": "en", "task": "translation",
         "checkpoint": str(de_en.resolve())},
        {"name": "other", "source_lang": "src", "target_lang": "en", "task": "translation",
         "checkpoint": str(src_en.resolve())},
    ]  # fmt: skip
    assert other["checkpoint"] == str(src_en.resolve()) and "models" not in other
    assert unknown.status_code == 400 and "'src-tgt', 'de-en', 'other'" in unknown.json()["error"]


def test_languages_list_each_source_with_every_target(trained_copy_checkpoint, second_models):
    with three(trained_copy_checkpoint, second_models) as client:
        languages = client.get("/languages").json()
        schema = client.get("/openapi.json").json()["components"]["schemas"]["TranslateRequest"]
    assert languages == [
        {"code": "src", "name": "src", "targets": ["tgt", "en"]},
        {"code": "de", "name": "German", "targets": ["en"]},
    ]
    assert "model" in str(schema)


def test_a_libretranslate_body_picks_its_model_by_language_pair(trained_copy_checkpoint, second_models):
    with three(trained_copy_checkpoint, second_models) as client:
        ask = lambda source, target: client.post("/translate", json={"q": "1 2 3", "source": source, "target": target})  # noqa: E731
        ours = {
            name: texts_of(client.post("/translate", json={"text": "1 2 3", "model": name}))[0]
            for name in ("src-tgt", "de-en", "other")
        }
        answers = {pair: ask(*pair) for pair in [("src", "tgt"), ("auto", "tgt"), ("de", "en"), ("src", "en")]}
        several, none = ask("auto", "en"), ask("fr", "en")
    assert {pair: a.json()["translatedText"] for pair, a in answers.items()} == {
        ("src", "tgt"): ours["src-tgt"],
        ("auto", "tgt"): ours["src-tgt"],
        ("de", "en"): ours["de-en"],
        ("src", "en"): ours["other"],
    }
    # "auto" into en: the language of its text among de's and src's (py3langid knows de, not src: last, at 0)
    assert several.json() == {
        "translatedText": ours["de-en"],
        "detectedLanguage": {"confidence": 100, "language": "de"},
    }
    assert none.status_code == 400
    assert none.json()["error"] == "no model here translates fr to en; this server translates src-tgt, de-en, src-en"


def test_two_models_of_one_pair_answer_libretranslate_with_the_first(
    trained_copy_checkpoint, tiny_checkpoint, tmp_path
):
    """LibreTranslate's body names no model: where two share its pair, the first in --path order answers it (it had
    been refused, naming the one source twice), and ours still reaches either by name."""
    second = relabeled(tiny_checkpoint, tmp_path / "second.pt", "src", "tgt")
    with serving(trained_copy_checkpoint, more_paths=(f"second={second}",)) as client:
        first = texts_of(client.post("/translate", json={"text": "1 2 3"}))[0]
        other = texts_of(client.post("/translate", json={"text": "1 2 3", "model": "second"}))[0]
        libre = [client.post("/translate", json={"q": "1 2 3", "source": s, "target": "tgt"}) for s in ("src", "auto")]
    assert first != other
    assert [r.json()["translatedText"] for r in libre] == [first] * 2
    assert libre[1].json()["detectedLanguage"] == {"confidence": 100, "language": "src"}


def test_two_models_of_one_name_are_refused_naming_both_paths(tiny_checkpoint, second_models):
    de_en, _ = second_models
    with pytest.raises(ConfigError) as refused:
        Models.open(ServeConfig(path=str(de_en), more_paths=(f"de-en={tiny_checkpoint}",), device="cpu"), {})
    assert str(refused.value).startswith(f"--path {de_en} and --path de-en={tiny_checkpoint} both serve a model named")


def test_a_path_names_its_model_before_an_equals_sign_unless_it_is_a_file(tmp_path):
    assert split_path("en-de=a/b.pt") == ("en-de", "a/b.pt")
    assert split_path("a/b.pt") == (None, "a/b.pt")
    assert split_path("x=a.pt:b.pt") == ("x", "a.pt:b.pt")  # an ensemble is passed through
    odd = tmp_path / "lr=0.1.pt"
    odd.write_bytes(b"")
    assert split_path(str(odd)) == (None, str(odd))


def test_the_command_serves_several_paths_with_one_worker(trained_copy_checkpoint, second_models):
    de_en, _ = second_models
    proc, port, lines = start_server(trained_copy_checkpoint, "--path", f"dutch={de_en}")
    try:
        wait_ready(port)
        status, answer = post(port, {"text": "1 2 3", "model": "dutch"})
        default_status, _ = post(port, {"text": "1 2 3"})
    finally:
        proc.terminate()
        proc.wait(30)
    assert status == default_status == 200, answer
    assert f"serving src-tgt: {trained_copy_checkpoint}, dutch: {de_en} on http://" in "".join(lines)


def test_a_model_that_fails_its_warm_up_is_named_by_its_path():
    from types import SimpleNamespace

    from nmt_cli.serve.models import Model

    def fails():
        raise RuntimeError("no kernel for this precision")

    fine, broken = SimpleNamespace(warm_up=lambda: None), SimpleNamespace(warm_up=fails)
    models = Models([Model("a", "a.pt", fine), Model("b", "b=x.pt", broken)])
    with pytest.raises(ConfigError, match=r"^--path b=x\.pt: the model failed to translate a warm-up sentence: "):
        models.warm_up()
    with pytest.raises(RuntimeError):  # one model: as before, commands/serve.py words it
        Models([Model("b", "x.pt", broken)]).warm_up()


def test_a_served_sentence_is_answered_when_its_search_ends_with_what_the_batch_returns(trained_copy_checkpoint):
    """On a GPU (`answers_early`), the batcher's `answer` reaches the beam search (Models.run -> BatchSearch.run ->
    translate_steps): the short sentence of a batch is answered before the long one's steps end, with the result
    the batch returns; a batch in which a sentence asks for an alignment is answered at its end."""
    from nmt_cli.serve.models import key_of
    from nmt_cli.steps import run_to_end
    from tests.search.test_steps import counting

    models = Models.open(ServeConfig(path=str(trained_copy_checkpoint), device="cpu", threads=1), {})
    served = models.default.served
    assert not served.searcher.answers_early  # on the CPU; forced here, as on a GPU
    served.searcher.answers_early = True
    served.warm_up()
    texts = ["0", "1 2 3 4 5 6 7 8 9 1 2 3 4 5 6 7"]  # the copy model answers each in its own length
    sentences = served.reader.prepare(texts)
    key, told, steps = key_of(models.default, served.search), [], [0]
    search = models.run(key, sentences, lambda: [True] * 2, lambda i, r: told.append((i, steps[0], r)))
    results = counting(search, steps)
    assert [i for i, _, _ in told] == [0] and told[0][2] == results[0] and told[0][1] < steps[0]
    assert results == run_to_end(models.run(key, served.reader.prepare(texts), lambda: [True] * 2, lambda i, r: None))
    aligned = [replace(sentences[0], alignment="hard"), sentences[1]]
    told.clear()
    run_to_end(models.run(key, aligned, lambda: [True] * 2, lambda i, r: told.append(i)))
    assert told == []
