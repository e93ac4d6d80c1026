"""A parsing checkpoint served: trees, exactly as `nmt generate` writes them for the same sentences."""

import pytest
from click.testing import CliRunner

from nmt_cli.cli import cli
from tests.parsing.treebank_data import preprocess, write_split
from tests.serve.serving import serving

pytest.importorskip("starlette")
pytest.importorskip("httpx")

SENTENCES = ["The cat sits on the mat .", "Dogs bark", "", "x ( y )"]


def invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("leaves", ["pos", "words", "words-ahead"])
def test_a_parser_answers_the_trees_generate_writes(tmp_path, leaves):
    """Both kinds of parser: tags at the leaves, and trees that spell their words (copied under the search's
    constraint, which serve must apply as generate does: the two had drifted apart once)."""
    write_split(tmp_path / "train", 30)
    result = preprocess(tmp_path, "--tree-leaves", leaves)
    assert result.exit_code == 0, result.output
    invoke(
        "train",
        tmp_path / "bin",
        "--save-dir",
        tmp_path / "ck",
        "--arch",
        "transformer_tiny",
        "--max-tokens",
        "400",
        "--max-update",
        "2",
        "--warmup-updates",
        "2",
        "--threads",
        "1",
        "--device",
        "cpu",
    )
    ckpt = tmp_path / "ck" / "checkpoint_last.pt"
    (tmp_path / "in.words").write_text("\n".join(SENTENCES) + "\n")
    expected = invoke(
        "generate",
        "--path",
        ckpt,
        "--input",
        tmp_path / "in.words",
        "--beam",
        "3",
        "--max-len-b",
        "40",
        "--device",
        "cpu",
        "--threads",
        "1",
    ).stdout.splitlines()
    with serving(ckpt, search={"beam": 3, "max_len_b": 40}) as client:
        answer = client.post("/translate", json={"texts": SENTENCES})
        refused = client.post("/translate", json={"text": "Dogs bark", "nbest": 2, "beam": 3})
        info = client.get("/info").json()
        libre = client.post("/translate", json={"q": "Dogs bark", "source": "auto", "target": info["target_lang"]})
        languages = client.get("/languages").json()
    assert answer.status_code == 200, answer.text
    assert [t["text"] for t in answer.json()["translations"]] == expected
    assert expected[0].startswith("(TOP") and expected[2] == ""
    assert refused.status_code == 400 and "parsing model" in refused.json()["error"]
    assert info["task"] == "parsing"
    assert libre.status_code == 400 and "this server parses" in libre.json()["error"]
    assert languages == [{"code": info["source_lang"], "name": info["source_lang"], "targets": []}]
