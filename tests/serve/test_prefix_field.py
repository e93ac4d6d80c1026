"""`nmt serve`'s `prefix` request field (a string beside "text", a list beside "texts") answers what `nmt generate
--prefix-file` writes, and a bad prefix is a 400 naming the field; `no_repeat_ngram_size` is a search field."""

import pytest

from tests.serve.serving import SENTENCES, generate_jsonl, serving

pytest.importorskip("starlette")
pytest.importorskip("httpx")

PREFIXES = ["7 7", "", "3", "1 2", "", "9", "0 0", "5"]


def test_prefixes_answer_what_generate_writes(tiny_checkpoint, tmp_path):
    prefix_file = tmp_path / "prefixes.txt"
    prefix_file.write_text("\n".join(PREFIXES) + "\n")
    expected = generate_jsonl(tiny_checkpoint, tmp_path, SENTENCES, "--prefix-file", str(prefix_file), "--nbest", "2")
    with serving(tiny_checkpoint) as client:
        many = client.post("/translate", json={"texts": SENTENCES, "prefix": PREFIXES, "nbest": 2})
        one = client.post("/translate", json={"text": SENTENCES[0], "prefix": PREFIXES[0], "nbest": 2})
        ban = client.post("/translate", json={"texts": SENTENCES, "no_repeat_ngram_size": 1, "max_len_b": 20})
    assert many.status_code == 200, many.text
    got = many.json()["translations"]
    assert [t["nbest"] for t in got] == [r["hypotheses"] for r in expected]
    for t, prefix in zip(got, PREFIXES):
        assert all(h["text"].startswith(prefix) for h in t["nbest"])
    alone = one.json()["translations"][0]  # batched alone: the untrained model's near ties may swap its 2nd best
    assert alone["text"] == got[0]["text"]
    assert alone["score"] == pytest.approx(got[0]["score"], abs=1e-3)
    assert ban.status_code == 200, ban.text
    for t in ban.json()["translations"]:
        assert len(set(t["text"].split())) == len(t["text"].split())  # pieces of the digit corpus are its words


@pytest.mark.parametrize(
    "body, said",
    [
        ({"text": "1 2", "prefix": ["1"]}, "'prefix' must be a string beside 'text', not an array"),
        ({"texts": ["1 2", "3"], "prefix": ["1"]}, "'prefix' must be a list of 2 strings beside 'texts'"),
        ({"texts": ["1 2"], "prefix": "1"}, "'prefix' must be a list of 1 strings beside 'texts'"),
        ({"texts": ["1 2"], "prefix": [3]}, "'prefix'[0] must be a string, not a number"),
        ({"texts": ["1 2", "3"], "prefix": ["", "1 2 3 4 5 6"], "max_len_b": 2}, "prefix[1]: the prefix has "),
        ({"text": "", "prefix": "1"}, "prefix[0]: the prefix is given for an empty input"),
        ({"text": "1", "prefix": "\u25811 \u25812"}, "prefix[0]: the prefix holds sentencepiece pieces"),
        ({"texts": ["1", "2"], "prefix": ["", "1\n2"]}, "prefix[1]: the prefix holds a line break"),
        ({"text": "1", "prefix": "1 \u4e2d"}, "prefix[0]: the prefix has characters the model's vocabulary lacks"),
        (
            {"text": "1 2", "prefix": "4 5", "constraints": ["6 7"], "max_len_a": 0, "max_len_b": 3},
            "prefix[0]: the prefix's first 2 pieces and the 2 the constraints then need make 4",
        ),
    ],
)
def test_a_bad_prefix_is_a_400_naming_it(tiny_checkpoint, body, said):
    with serving(tiny_checkpoint) as client:
        response = client.post("/translate", json=body)
    assert response.status_code == 400, response.text
    assert said in response.json()["error"], response.text
