"""U+2581, sentencepiece's word mark, is text: only a text that reads as pieces joined by spaces is refused, by
`nmt serve` and `nmt generate` alike, and a mark in ordinary text is read as a space by both."""

import io
import random
from pathlib import Path

import pytest

from nmt_cli.data import raw_text_problem
from tests.serve.serving import generate_jsonl, serving

MULTI30K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"
MARK = "\u2581"
# Ordinary text that holds the character: a keyboard legend, a lone marked word, a mark inside a word, a row
# of marks, one marked word beside others
TEXTS_WITH_THE_MARK = [
    f"press {MARK} to continue",
    f"{MARK}hello",
    f"{MARK}",
    f"{MARK}{MARK}{MARK} fill in the blank",
    f"a{MARK}b {MARK}c {MARK}d",
    f"{MARK}foo is an identifier",
    f"the bar {MARK}{MARK} ends here",
]


@pytest.mark.parametrize("text", TEXTS_WITH_THE_MARK)
def test_text_that_merely_holds_the_word_mark_is_text(text):
    assert raw_text_problem(text) is None


@pytest.mark.parametrize(
    "text", [f"{MARK}1 {MARK}2", f"{MARK}Ein {MARK}Mann {MARK}in {MARK}eine m .", f"{MARK}a b {MARK}c"]
)
def test_pieces_joined_by_spaces_are_refused(text):
    assert raw_text_problem(text).startswith("holds sentencepiece pieces")


@pytest.mark.skipif(not (MULTI30K / "train.de").exists(), reason=f"needs {MULTI30K}")
@pytest.mark.parametrize("vocab_size", [500, 4000])
def test_real_sentencepiece_output_of_multi30k_is_refused_in_every_language(vocab_size):
    import sentencepiece as spm

    rng = random.Random(0)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        input=",".join(str(MULTI30K / f"train.{lang}") for lang in ("en", "de", "fr", "cs")),
        model_writer=model,
        vocab_size=vocab_size,
        input_sentence_size=8000,
        shuffle_input_sentence=True,
        minloglevel=2,
        num_threads=1,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    for lang in ("en", "de", "fr", "cs"):
        lines = (MULTI30K / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()
        for line in rng.sample(lines, 200):
            pieces = " ".join(sp.encode(line, out_type=str))
            if len(line.split()) > 1:  # one word split in pieces reads as text (a mark and its word's rest)
                assert raw_text_problem(pieces) is not None, pieces
            assert raw_text_problem(line) is None, line


def test_serve_and_generate_read_the_mark_as_a_space_and_agree(trained_copy_checkpoint, tmp_path):
    texts = [f"1{MARK}2 3", "1 2 3", f"{MARK}4 5 6", f"{MARK}{MARK}{MARK}", f"7 {MARK} 8"]
    expected = generate_jsonl(trained_copy_checkpoint, tmp_path, texts)
    with serving(trained_copy_checkpoint) as client:
        response = client.post("/translate", json={"texts": texts})
    assert response.status_code == 200, response.text
    translations = response.json()["translations"]
    assert [t["text"] for t in translations] == [r["hypotheses"][0]["text"] for r in expected]
    assert [t["score"] for t in translations] == [r["hypotheses"][0]["score"] for r in expected]
    assert translations[0] == translations[1]  # the mark is a space to sentencepiece
    assert translations[3]["text"] == ""  # only marks: an empty sentence, as an empty line


def test_serve_and_generate_refuse_pieces_alike(tiny_checkpoint, tmp_path):
    with serving(tiny_checkpoint) as client:
        response = client.post("/translate", json={"texts": ["1 2", f"{MARK}3 {MARK}4"]})
    assert response.status_code == 400
    assert response.json()["error"].startswith("texts[1]: the text holds sentencepiece pieces")
    from click.testing import CliRunner

    from nmt_cli.cli import cli

    src = tmp_path / "pieces.txt"
    src.write_text(f"1 2\n{MARK}3 {MARK}4\n")
    result = CliRunner().invoke(cli, ["generate", "--path", str(tiny_checkpoint), "--input", str(src)])
    assert result.exit_code == 1
    assert f"{src}:2: the line holds sentencepiece pieces" in result.output
