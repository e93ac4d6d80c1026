"""A text cut into the sentences a model translates and put back with its own spacing, lines and HTML markup
(serve/segments.py), and the source language told among the served ones (serve/detect.py)."""

import pytest

from nmt_cli.serve.segments import cut, joined

pytest.importorskip("sentencex")


@pytest.mark.parametrize(
    "text, sentences",
    [
        ("  Hello world.  This is Mr. Smith!\r\nNew line?\n\n", ["Hello world.", "This is Mr. Smith!", "New line?"]),
        ("1 2 3. 4 5 6", ["1 2 3.", "4 5 6"]),
        ("one line, no end", ["one line, no end"]),
        (" \n\t", []),
        ("", []),
    ],
)
def test_sentences_are_cut_and_put_back_in_their_own_spacing(text, sentences):
    parts = cut(text, "en", sentences=True)
    assert parts[1::2] == sentences
    assert joined(parts, parts[1::2]) == text  # nothing lost
    upper = joined(parts, [s.upper() for s in sentences])
    assert upper == text.upper()  # each translation where its sentence was, the spacing between kept


def test_without_sentences_only_lines_are_cut():
    parts = cut("A. B.\r\nC. D.", "en", sentences=False)
    assert parts == ["", "A. B.", "\r\n", "C. D.", ""]


def test_html_text_is_translated_between_the_tags_and_the_markup_kept():
    page = (
        '<!DOCTYPE html><p class="x">Fish &amp; chips. Are <b>good</b>!</p>\n'
        '<script>var a = "x < y";</script><style>p {}</style><!-- a comment --><br/> <?pi x?>&lt;end&gt;'
    )
    parts = cut(page, "en", sentences=True, html=True)
    assert parts[1::2] == ["Fish & chips.", "Are", "good", "!", "<end>"]  # references decoded for the model
    assert joined(parts, parts[1::2], html=True) == page  # the markup kept, the texts escaped again
    translated = joined(parts, ["Fisch & Pommes.", "Sind", "gut", "!", "<Ende>"], html=True)
    assert translated == page.replace("Fish &amp; chips.", "Fisch &amp; Pommes.").replace("Are", "Sind").replace(
        "good", "gut"
    ).replace("&lt;end&gt;", "&lt;Ende&gt;")


def test_an_unknown_language_is_cut_by_the_fallback_rules():
    assert cut("Erster Satz. Zweiter Satz.", "src", sentences=True)[1::2] == ["Erster Satz.", "Zweiter Satz."]


def info(source, target="de", task="translation"):
    return {"source_lang": source, "target_lang": target, "task": task}


def test_one_source_language_is_detected_at_100_and_several_by_py3langid():
    pytest.importorskip("py3langid")
    from nmt_cli.serve.detect import Detector

    assert Detector([info("en"), info("en", "fr")]).rank("Das ist ein Haus.") == [{"confidence": 100, "language": "en"}]
    several = Detector([info("en"), info("fr"), info("xx"), info("de", "ptb-tree", "parsing")])
    ranked = several.rank("La maison est petite et le jardin est vert.")
    assert [r["language"] for r in ranked] == ["fr", "en", "xx"]  # a parser's language is not a source; xx unknown
    assert ranked[0]["confidence"] > 90 and ranked[-1]["confidence"] == 0
    assert several.rank("The house is small and the garden is green.")[0]["language"] == "en"
    body = {"q": ["The house is small.", "The garden is green."], "source": "auto", "target": "de"}
    assert several.resolve(body)["language"] == "en" and body["source"] == "en"
    assert several.resolve({"q": "x", "source": "en", "target": "de"}) is None  # a named source stays
    assert Detector([info(None)]).resolve({"q": "x", "source": "auto", "target": "de"}) is None  # none named
