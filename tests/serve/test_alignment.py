"""`nmt serve`'s `"alignment"` request field: each translation aligned as `nmt generate --print-alignment` aligns it."""

import numpy as np
import pytest

from tests.serve.serving import SENTENCES, generate_jsonl, serving

pytest.importorskip("starlette")
pytest.importorskip("httpx")


def test_alignments_are_those_of_generate(trained_copy_checkpoint, tmp_path):
    ckpt = trained_copy_checkpoint  # attention decisive enough that batching cannot flip a hard alignment
    hard = generate_jsonl(ckpt, tmp_path, SENTENCES, "--print-alignment", "hard")
    soft = generate_jsonl(ckpt, tmp_path, SENTENCES, "--print-alignment", "soft", "--nbest", "2")
    with serving(ckpt) as client:
        asked = client.post("/translate", json={"texts": SENTENCES, "alignment": "hard"})
        nbest = client.post("/translate", json={"texts": SENTENCES, "alignment": "soft", "nbest": 2})
        plain = client.post("/translate", json={"texts": SENTENCES})
    assert asked.status_code == 200, asked.text
    got = asked.json()["translations"]
    assert [t["alignment"] for t in got] == [r["hypotheses"][0]["alignment"] for r in hard]
    assert all(len(t["alignment"].split()) == len(r["hypotheses"][0]["tokens"]) for t, r in zip(got, hard))
    assert nbest.status_code == 200, nbest.text
    for t, r in zip(nbest.json()["translations"], soft):
        assert len(t["nbest"]) == len(r["hypotheses"]) == 2
        for h, expected in zip(t["nbest"], r["hypotheses"]):
            assert np.allclose(
                np.array(h["alignment"]).reshape(-1), np.array(expected["alignment"]).reshape(-1), atol=2e-4
            )
    assert all("alignment" not in t for t in plain.json()["translations"])


@pytest.mark.parametrize("value", ["diagonal", 1, None])
def test_a_bad_alignment_field_is_a_400_naming_it(tiny_checkpoint, value):
    with serving(tiny_checkpoint) as client:
        answer = client.post("/translate", json={"text": "1 2", "alignment": value})
    if value is None:  # JSON null: none asked
        assert answer.status_code == 200 and "alignment" not in answer.json()["translations"][0]
    else:
        assert answer.status_code == 400 and answer.json()["error"].startswith('"alignment" must be "hard" or "soft"')
