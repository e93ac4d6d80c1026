"""LibreTranslate's API beside ours (POST /translate with "q", GET /languages), /openapi.json, and /info on an
averaged checkpoint, in-process."""

import json
from urllib.parse import urlencode

import pytest

from tests.serve.serving import SENTENCES, serving

pytest.importorskip("starlette")
pytest.importorskip("httpx")

KEY = "s3cret-key"


def libre(q, **fields):
    """The body libretranslatepy and LibreTranslate's other clients post."""
    return {"q": q, "source": "src", "target": "tgt", "format": "text", **fields}


def test_a_libretranslate_body_is_answered_in_its_shape_with_our_translations(trained_copy_checkpoint):
    with serving(trained_copy_checkpoint) as client:
        ours = client.post("/translate", json={"texts": SENTENCES}).json()["translations"]
        one = client.post("/translate", json=libre(SENTENCES[1]))
        many = client.post("/translate", json=libre(SENTENCES, source="auto"))
        form = client.post(
            "/translate",
            content=urlencode({"q": SENTENCES[0], "source": "src", "target": "tgt"}),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        alternatives = client.post("/translate", json=libre(SENTENCES[0], alternatives=2))
        nbest = client.post("/translate", json={"text": SENTENCES[0], "nbest": 3}).json()["translations"][0]
    assert one.status_code == 200, one.text
    assert one.json() == {"translatedText": ours[1]["text"]}
    auto = {"confidence": 100, "language": "src"}  # the one language the server translates from
    assert many.json() == {"translatedText": [t["text"] for t in ours], "detectedLanguage": [auto] * len(ours)}
    assert form.json() == {"translatedText": ours[0]["text"]}
    assert alternatives.json() == {
        "translatedText": nbest["text"],
        "alternatives": [h["text"] for h in nbest["nbest"][1:]],
    }


def multipart(fields):
    """A multipart/form-data body as `curl -F name=value ...` sends it, and its Content-Type."""
    parts = [f'--B\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    return ("".join(parts) + "--B--\r\n").encode(), "multipart/form-data; boundary=B"


def test_libretranslate_bodies_as_its_clients_and_curl_send_them(trained_copy_checkpoint):
    """Multipart forms (`curl -F`), a Content-Type of any case, JSON that curl -d labels a form, alternatives past
    the server's beam, and a text of several lines (translated line by line, its line breaks kept)."""
    fields = {"q": SENTENCES[0], "source": "src", "target": "tgt"}
    with serving(trained_copy_checkpoint) as client:
        ours = client.post("/translate", json={"texts": SENTENCES[:2]}).json()["translations"]
        content, kind = multipart(fields)
        forms = [
            client.post("/translate", content=content, headers={"Content-Type": kind}),
            client.post(
                "/translate", content=urlencode(fields), headers={"Content-Type": "Application/X-WWW-Form-Urlencoded"}
            ),
        ]
        labelled = client.post(
            "/translate", content=json.dumps(fields), headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        wide = client.post("/translate", json=libre(SENTENCES[0], alternatives=5))
        lines = client.post("/translate", json=libre(f"{SENTENCES[0]}\r\n{SENTENCES[1]}", alternatives=1))
        no_q = client.post(
            "/translate", content="source=src", headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
    for response in [*forms, labelled]:
        assert response.status_code == 200 and response.json() == {"translatedText": ours[0]["text"]}, response.text
    assert wide.status_code == 200 and len(wide.json()["alternatives"]) == 5, wide.text
    assert lines.json()["translatedText"] == f"{ours[0]['text']}\r\n{ours[1]['text']}"  # its own line break kept
    assert len(lines.json()["alternatives"]) == 1 and lines.json()["alternatives"][0].count("\n") == 1
    assert no_q.status_code == 400 and 'has no "q"' in no_q.json()["error"]


@pytest.mark.parametrize(
    "body, said",
    [
        ({"text": "1\n2"}, "text: the text holds a line break"),
        ({"texts": ["1", "2\n3"]}, "texts[1]: the text holds a line break"),
        (libre("\u25811 \u25812"), "q: the text holds sentencepiece pieces"),
        (libre(["1", "2\n\u25811 \u25812"]), "q[1] (sentence 2): the text holds sentencepiece pieces"),
        (
            {"texts": ["1", "2. \u25811 \u25812"], "split_sentences": True},
            "texts[1] (sentence 2): the text holds sentencepiece",
        ),
    ],
)
def test_a_bad_text_is_named_by_the_request_s_own_field(tiny_checkpoint, body, said):
    with serving(tiny_checkpoint) as client:
        response = client.post("/translate", json=body)
    assert response.status_code == 400 and response.json()["error"].startswith(said), response.text


def test_our_body_is_answered_as_before(tiny_checkpoint):
    with serving(tiny_checkpoint) as client:
        response = client.post("/translate", json={"text": "1 2 3"}).json()
    assert set(response) == {"translations", "seconds"}


@pytest.mark.parametrize(
    "body, words",
    [
        (libre("1 2", source="en"), ["\"source\" is 'en'", "src to tgt", '"auto"']),
        (libre("1 2", target="de"), ["\"target\" is 'de'", "src to tgt"]),
        (libre("1 2", format="xml"), ["\"format\" is 'xml'", '"text" or "html"']),
        (libre(" \n "), ['"q" holds no text']),
        (libre("1 2", split_sentences="yes"), ['"split_sentences" must be true or false']),
        (libre(3), ['"q" must be a string or a list of strings']),
        (libre([]), ['"q" is empty']),
        ({"q": "1 2", "target": "tgt"}, ['"source" must be a language code']),
        (libre("1 2", alternatives=-1), ['"alternatives" must be a whole number']),
        (libre("1 2", beam=2), ["unknown field 'beam'", "LibreTranslate's fields"]),
        (libre(["1 2"] * 5), ["5 texts in one request", "--max-request-sentences"]),
    ],
)
def test_a_wrong_libretranslate_body_gets_400_naming_its_field(tiny_checkpoint, body, words):
    with serving(tiny_checkpoint, max_request_sentences=4) as client:
        response = client.post("/translate", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert all(w in error for w in words), error


def test_a_libretranslate_body_may_carry_the_api_key(tiny_checkpoint):
    with serving(tiny_checkpoint, limits={"api_key": KEY}) as client:
        keyed = client.post("/translate", json=libre("1 2", api_key=KEY))
        form = client.post(
            "/translate",
            content=urlencode({"q": "1 2", "source": "src", "target": "tgt", "api_key": KEY}),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        header = client.post("/translate", json=libre("1 2"), headers={"Authorization": f"Bearer {KEY}"})
        wrong = client.post("/translate", json=libre("1 2", api_key="wrong"))
        missing = client.post("/translate", json=libre("1 2"))
        ours_with_key_field = client.post("/translate", json={"text": "1 2", "api_key": KEY})
        unreadable = client.post("/translate", content=b"{not json")  # without the key: 401, not why it is bad
        languages = client.get("/languages")
        openapi = client.get("/openapi.json")
        settings = client.get("/frontend/settings")
    assert keyed.status_code == form.status_code == header.status_code == 200, (keyed.text, form.text)
    assert wrong.status_code == 403 and "Invalid API key" in wrong.json()["error"]  # LibreTranslate's answers
    assert missing.status_code == 400 and "api_key" in missing.json()["error"]
    for response in (ours_with_key_field, unreadable):  # only LibreTranslate's body carries a key
        assert response.status_code == 401, response.text
        assert "api_key" in response.json()["error"] and response.headers["www-authenticate"] == "Bearer"
    assert languages.status_code == openapi.status_code == settings.status_code == 200  # open, like /health
    assert settings.json()["keyRequired"] is True  # LibreTranslate's front end then asks for the key


def test_languages_lists_the_checkpoints_direction(tiny_checkpoint):
    with serving(tiny_checkpoint) as client:
        assert client.get("/languages").json() == [{"code": "src", "name": "src", "targets": ["tgt"]}]


def test_languages_of_a_parser_and_of_a_checkpoint_without_languages():
    from nmt_cli.serve.libretranslate import languages

    info = {"source_lang": "en", "target_lang": "ptb-tree", "task": "parsing"}
    assert languages(info) == [{"code": "en", "name": "English", "targets": []}]
    assert languages({**info, "source_lang": None, "task": "translation"}) == []


def test_openapi_describes_every_route(tiny_checkpoint):
    with serving(tiny_checkpoint) as client:
        response = client.get("/openapi.json")
        routes = {route.path for route in client.app.routes}
    document = json.loads(response.text)
    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) == routes
    assert "translatedText" in json.dumps(document["components"]["schemas"])
    bodies = document["paths"]["/translate"]["post"]["requestBody"]["content"]  # every kind the server reads
    assert set(bodies) == {"application/json", "application/x-www-form-urlencoded", "multipart/form-data"}


def test_info_of_an_averaged_checkpoint_says_what_it_averages(tiny_checkpoint, tmp_path):
    from nmt_cli.checkpoint import save_checkpoint
    from nmt_cli.commands.average import average_checkpoints

    inputs = [tiny_checkpoint.parent / "checkpoint_2.pt", tiny_checkpoint.parent / "checkpoint_4.pt"]
    averaged = tmp_path / "averaged.pt"
    save_checkpoint(average_checkpoints(inputs), averaged)
    with serving(averaged) as client:
        info = client.get("/info").json()
    assert info["update"] == 4  # the newest update averaged, not the first input's
    assert info["averaged_from"] == [str(p) for p in inputs]
    assert info["averaged_updates"] == [2, 4]


def test_fields_in_the_query_string_and_a_form_are_read_as_libretranslate_reads_them(tiny_checkpoint):
    """deep-translator posts every field in the query string with an empty body; a form may give the rest."""
    query = urlencode({"q": "1 2", "source": "src", "target": "tgt", "format": "text"})
    with serving(tiny_checkpoint, limits={"api_key": KEY}) as client:
        expected = client.post("/translate", json=libre("1 2", api_key=KEY)).json()
        in_query = client.post(f"/translate?{query}&api_key={KEY}")
        mixed = client.post(
            f"/translate?source=src&target=tgt&api_key={KEY}",
            content="q=1+2",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        wrong = client.post(f"/translate?{query}&api_key=wrong")
        nothing = client.post("/translate", headers={"Authorization": f"Bearer {KEY}"})
    assert in_query.status_code == 200 and in_query.json() == expected, in_query.text
    assert mixed.json() == expected
    assert wrong.status_code == 403
    assert nothing.status_code == 400 and 'has no "q"' in nothing.json()["error"]


def test_a_text_is_translated_sentence_by_sentence_and_put_back_in_its_spacing(trained_copy_checkpoint):
    text = "1 2 3. 4 5 6\n7 7"
    with serving(trained_copy_checkpoint) as client:
        one = [
            t["text"]
            for t in client.post("/translate", json={"texts": ["1 2 3.", "4 5 6", "7 7"]}).json()["translations"]
        ]
        whole = client.post("/translate", json={"text": "1 2 3. 4 5 6"}).json()["translations"][0]["text"]
        split = client.post("/translate", json=libre(text)).json()
        unsplit = client.post("/translate", json=libre(text, split_sentences=False)).json()
        ours = client.post("/translate", json={"text": text, "split_sentences": True}).json()["translations"][0]
        html = client.post("/translate", json=libre("<p>1 2 3. <b>4 5 6</b></p>\n7 7", format="html")).json()
        refused = client.post("/translate", json={"text": text, "split_sentences": True, "prefix": "1"})
    assert split == {"translatedText": f"{one[0]} {one[1]}\n{one[2]}"}
    assert unsplit == {"translatedText": f"{whole}\n{one[2]}"}
    assert ours["text"] == split["translatedText"] and [s["text"] for s in ours["sentences"]] == one
    assert html == {"translatedText": f"<p>{one[0]} <b>{one[1]}</b></p>\n{one[2]}"}
    assert refused.status_code == 400 and "\"split_sentences\" cannot take 'prefix'" in refused.json()["error"]


def test_a_truncation_warning_reaches_a_libretranslate_answer(tiny_checkpoint):
    long_line = " ".join(["5"] * 400)  # transformer_tiny has 256 positions
    with serving(tiny_checkpoint) as client:
        one = client.post("/translate", json=libre(long_line)).json()
        many = client.post("/translate", json=libre([long_line, "1 2"])).json()
    assert "truncated to 255" in one["warning"]
    assert "truncated to 255" in many["warning"][0] and many["warning"][1] is None


def test_detect_and_source_auto_tell_the_served_source_languages_apart(
    trained_copy_checkpoint, tiny_checkpoint, tmp_path
):
    pytest.importorskip("py3langid")
    from tests.serve.serving import relabeled

    english, french = "The house is small and the garden is green.", "La maison est petite et le jardin est vert."
    en_de = relabeled(trained_copy_checkpoint, tmp_path / "en_de.pt", "en", "de")
    fr_de = relabeled(tiny_checkpoint, tmp_path / "fr_de.pt", "fr", "de")
    with serving(en_de, more_paths=(str(fr_de),)) as client:
        detected = client.post("/detect", json={"q": french}).json()
        form = client.post("/detect", data={"q": english}).json()
        auto = client.post("/translate", json={"q": [french], "source": "auto", "target": "de"}).json()
        ours = client.post("/translate", json={"text": french, "model": "fr-de"}).json()["translations"][0]
        no_text = client.post("/detect", json={"q": ""})
        settings = client.get("/frontend/settings").json()
    assert [d["language"] for d in detected] == ["fr", "en"] and detected[0]["confidence"] > 90
    assert form[0]["language"] == "en"
    assert auto["translatedText"] == [ours["text"]] and auto["detectedLanguage"][0]["language"] == "fr"
    assert no_text.status_code == 400
    assert settings["language"] == {
        "source": {"code": "auto", "name": "Auto Detect"},
        "target": {"code": "de", "name": "German"},
    }
    assert settings["keyRequired"] is False and settings["charLimit"] > 0
