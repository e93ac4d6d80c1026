"""The LibreTranslate clients people use, libretranslatepy and deep-translator, against a real `nmt serve`, with
and without an API key: translate, translate_batch, languages and detect answer as the server's own API does.
(deep-translator posts its fields in the query string with an empty body; libretranslatepy posts a form.)"""

import json
import urllib.error
import urllib.request

import pytest

from tests.serve.serving import SENTENCES, relabeled
from tests.serve.test_signals import start_server, wait_ready

pytest.importorskip("uvicorn")
libretranslatepy = pytest.importorskip("libretranslatepy")
deep_translator = pytest.importorskip("deep_translator")

KEY = "s3cret-key_67"


def ours(url, texts, key):
    """The server's own translations of `texts`."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"{url}translate", json.dumps({"texts": texts}).encode(), headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return [t["text"] for t in json.loads(response.read())["translations"]]


@pytest.mark.parametrize("key", [None, KEY])
def test_libretranslatepy_and_deep_translator_translate_detect_and_list_languages(
    trained_copy_checkpoint, tmp_path, key
):
    from deep_translator import LibreTranslator
    from deep_translator.exceptions import AuthorizationException
    from libretranslatepy import LibreTranslateAPI

    ckpt = relabeled(trained_copy_checkpoint, tmp_path / "en-de.pt", "en", "de")  # codes deep-translator knows
    proc, port, _ = start_server(ckpt, *(["--api-key", key] if key else []))
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_ready(port)
        expected = ours(url, SENTENCES[:3], key)
        libre = LibreTranslateAPI(url, api_key=key)
        deep = LibreTranslator(source="en", target="de", api_key=key or "none needed", custom_url=url)
        assert libre.translate(SENTENCES[0], "en", "de") == expected[0]
        assert libre.translate(SENTENCES[1], "auto", "de") == expected[1]
        assert libre.detect(SENTENCES[2]) == [{"confidence": 100, "language": "en"}]
        assert libre.languages() == [{"code": "en", "name": "English", "targets": ["de"]}]
        assert deep.translate(SENTENCES[0]) == expected[0]
        assert deep.translate_batch(SENTENCES[:3]) == expected
        if (
            key
        ):  # LibreTranslate's answers: 403 for a wrong key (deep-translator's AuthorizationException), 400 for none
            with pytest.raises(AuthorizationException):
                LibreTranslator(source="en", target="de", api_key="wrong", custom_url=url).translate(SENTENCES[0])
            for client, status in ((LibreTranslateAPI(url, api_key="wrong"), 403), (LibreTranslateAPI(url), 400)):
                with pytest.raises(urllib.error.HTTPError) as refused:
                    client.detect(SENTENCES[0])
                assert refused.value.code == status
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in proc.stderr.read()
