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
    assert many.json() == {"translatedText": [t["text"] for t in ours]}
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
    the server's beam, and a text of several lines (translated line by line, as LibreTranslate keeps lines)."""
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
    assert lines.json()["translatedText"] == f"{ours[0]['text']}\n{ours[1]['text']}"
    assert len(lines.json()["alternatives"]) == 1 and lines.json()["alternatives"][0].count("\n") == 1
    assert no_q.status_code == 400 and 'the form has no "q"' in no_q.json()["error"]


@pytest.mark.parametrize(
    "body, said",
    [
        ({"text": "1\n2"}, "text: the text holds a line break"),
        ({"texts": ["1", "2\n3"]}, "texts[1]: the text holds a line break"),
        (libre("\u25811 \u25812"), "q: the text holds sentencepiece pieces"),
        (libre(["1", "2\n\u25811 \u25812"]), "q[1] (line 2): the text holds sentencepiece pieces"),
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
        (libre("1 2", format="html"), ["\"format\" is 'html'", '"text" only']),
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
    assert keyed.status_code == form.status_code == header.status_code == 200, (keyed.text, form.text)
    for response in (wrong, missing, ours_with_key_field, unreadable):  # only LibreTranslate's body carries a key
        assert response.status_code == 401, response.text
        assert "api_key" in response.json()["error"] and response.headers["www-authenticate"] == "Bearer"
    assert languages.status_code == openapi.status_code == 200  # open, like /health


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
