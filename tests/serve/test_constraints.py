"""The /translate field `constraints` (search/lexical.py): target phrases each translation contains, the same as
`nmt generate --constraints-file` gives; refused (400, naming the field) in any other shape."""

import pytest
from click.testing import CliRunner

from nmt_cli.cli import cli
from tests.parsing.treebank_data import preprocess, write_split
from tests.serve.serving import SENTENCES, generate_jsonl, serving

pytest.importorskip("starlette")
pytest.importorskip("httpx")


def test_constraints_are_met_as_generate_meets_them(tiny_checkpoint, tmp_path):
    phrases = [["9 9", "8"], [], ["7"]]
    with serving(tiny_checkpoint, search={"beam": 4}) as client:
        many = client.post("/translate", json={"texts": SENTENCES[:3], "constraints": phrases})
        one = client.post("/translate", json={"text": SENTENCES[0], "constraints": phrases[0]})
        plain = client.post("/translate", json={"text": SENTENCES[1]})
    assert many.status_code == 200, many.text
    texts = [t["text"] for t in many.json()["translations"]]
    assert "9 9" in texts[0] and "8" in texts[0] and "7" in texts[2]
    assert one.json()["translations"][0]["text"] == texts[0]
    assert plain.json()["translations"][0]["text"] == texts[1]
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join("\t".join(p) for p in phrases) + "\n")
    records = generate_jsonl(tiny_checkpoint, tmp_path, SENTENCES[:3], "--constraints-file", constraints)
    assert [r["hypotheses"][0]["text"] for r in records] == texts


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": "1 2", "constraints": "9"}, "'constraints' must be a list of strings beside 'text', not a string"),
        ({"text": "1 2", "constraints": [["9"]]}, "'constraints' must be a list of strings beside 'text', not an"),
        ({"texts": ["1 2", "3"], "constraints": [["9"]]}, "'constraints' must be a list of 2 lists of strings beside"),
        ({"texts": ["1 2"], "constraints": ["9"]}, "'constraints'[0] must be a list of strings, not a string"),
        ({"text": "1 2", "constraints": [""]}, "constraints[0]: constraint 1 is empty"),
        ({"text": "1 2", "constraints": ["1 2 3 4 5 6"], "max_len_a": 0, "max_len_b": 3}, "constraints[0]: the"),
        ({"text": "1 2", "constraints": ["9"], "sampling": True, "beam": 1}, "constraints needs beam search"),
    ],
)
def test_constraints_in_another_shape_are_refused(tiny_checkpoint, body, message):
    with serving(tiny_checkpoint) as client:
        response = client.post("/translate", json=body)
    assert response.status_code == 400
    assert message in response.json()["error"], response.json()


def test_a_parser_refuses_constraints(tmp_path):
    write_split(tmp_path / "train", 30)
    assert preprocess(tmp_path).exit_code == 0
    args = ["--arch", "transformer_tiny", "--max-tokens", "400", "--max-update", "1", "--warmup-updates", "1"]
    trained = CliRunner().invoke(cli, ["train", str(tmp_path / "bin"), "--save-dir", str(tmp_path / "ck"), *args])
    assert trained.exit_code == 0, trained.output
    ckpt = tmp_path / "ck" / "checkpoint_last.pt"
    (tmp_path / "in.words").write_text("Dogs bark\n")
    (tmp_path / "constraints.txt").write_text("NN\n")
    r = CliRunner().invoke(
        cli,
        ["generate", "--path", str(ckpt), "--input", str(tmp_path / "in.words")]
        + ["--constraints-file", str(tmp_path / "constraints.txt"), "--device", "cpu"],
    )
    assert r.exit_code == 1 and "--constraints-file cannot apply" in r.stderr and "parsing model" in r.stderr, r.output
    with serving(ckpt) as client:
        refused = client.post("/translate", json={"text": "Dogs bark", "constraints": ["NN"]})
    assert refused.status_code == 400 and "parsing model" in refused.json()["error"]
