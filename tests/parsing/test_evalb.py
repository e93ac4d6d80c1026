"""The bracket scorer against EVALB's published sample (sample.rsl) and hand-computed cases."""

from pathlib import Path

import pytest

from nmt_cli.parsing.evalb import COLLINS, ERROR, OK, SKIP, EvalbParams, evalb, format_report, score_sentence

DATA = Path(__file__).parent / "data"
# EVALB/sample/sample.prm
SAMPLE_PRM = EvalbParams(
    delete_labels=frozenset({"TOP", "-NONE-", ",", ":", "``", "''"}),
    eq_labels=(("T", "TT"),),
    eq_words=(("This", "this"),),
)
# EVALB/sample/sample.rsl: (line, length, status, recall, precision, matched, gold, test, crossing, words, tags)
SAMPLE_RSL = [
    (1, 4, 0, 100.00, 100.00, 4, 4, 4, 0, 4, 4),
    (2, 4, 0, 75.00, 75.00, 3, 4, 4, 0, 4, 4),
    (3, 4, 0, 100.00, 100.00, 4, 4, 4, 0, 4, 3),
    (4, 4, 0, 75.00, 75.00, 3, 4, 4, 0, 4, 3),
    (5, 4, 0, 75.00, 75.00, 3, 4, 4, 0, 4, 4),
    (6, 4, 0, 50.00, 66.67, 2, 4, 3, 1, 4, 4),
    (7, 4, 0, 25.00, 100.00, 1, 4, 1, 0, 4, 4),
    (8, 4, 0, 0.00, 0.00, 0, 4, 0, 0, 4, 4),
    (9, 4, 0, 100.00, 80.00, 4, 4, 5, 0, 4, 4),
    (10, 4, 0, 100.00, 50.00, 4, 4, 8, 0, 4, 4),
    (11, 4, 2, 0, 0, 0, 0, 0, 0, 4, 0),
    (12, 4, 1, 0, 0, 0, 0, 0, 0, 4, 0),
    (13, 4, 1, 0, 0, 0, 0, 0, 0, 4, 0),
    (14, 4, 2, 0, 0, 0, 0, 0, 0, 4, 0),
    (15, 4, 0, 100.00, 100.00, 4, 4, 4, 0, 4, 4),
    (16, 4, 1, 0, 0, 0, 0, 0, 0, 4, 0),
    (17, 4, 1, 0, 0, 0, 0, 0, 0, 4, 0),
    (18, 4, 0, 100.00, 100.00, 4, 4, 4, 0, 4, 4),
    (19, 4, 0, 100.00, 100.00, 4, 4, 4, 0, 4, 4),
    (20, 4, 1, 0, 0, 0, 0, 0, 0, 4, 0),
    (21, 4, 0, 100.00, 100.00, 4, 4, 4, 0, 4, 4),
    (22, 44, 0, 100.00, 100.00, 34, 34, 34, 0, 44, 44),
    (23, 4, 0, 100.00, 100.00, 4, 4, 4, 0, 4, 4),
    (24, 5, 0, 100.00, 100.00, 4, 4, 4, 0, 4, 4),
]
SAMPLE_SUMMARY = {  # sample.rsl "-- All --" and "-- len<=40 --"
    "all": dict(
        sentences=24,
        error_sentences=5,
        skip_sentences=2,
        valid_sentences=17,
        recall=87.76,
        precision=90.53,
        complete_match=52.94,
        average_crossing=0.06,
        no_crossing=94.12,
        two_or_less_crossing=100.00,
        tagging_accuracy=98.15,
    ),
    "short": dict(
        sentences=23,
        error_sentences=5,
        skip_sentences=2,
        valid_sentences=16,
        recall=81.25,
        precision=85.25,
        complete_match=50.00,
        average_crossing=0.06,
        no_crossing=93.75,
        two_or_less_crossing=100.00,
        tagging_accuracy=96.88,
    ),
}


@pytest.fixture(scope="module")
def sample():
    gold = (DATA / "evalb_sample.gld").read_text().splitlines()
    test = (DATA / "evalb_sample.tst").read_text().splitlines()
    return evalb(gold, test, SAMPLE_PRM)


def test_every_sentence_matches_sample_rsl(sample):
    for r, expected in zip(sample.sentences, SAMPLE_RSL):
        line, length, status, recall, precision, match, gold, test, crossing, words, tags = expected
        assert (r.line, r.length, r.status, r.match, r.gold, r.test, r.crossing, r.words) == (
            line,
            length,
            status,
            match,
            gold,
            test,
            crossing,
            words,
        ), r
        if status == OK:
            assert r.correct_tags == tags
            assert round(100 * r.match / r.gold, 2) == recall and round(100 * r.match / max(r.test, 1), 2) == precision
        row = r.row()
        assert row.startswith(f"{line:4d}  {length:3d}    {status}  {recall:6.2f} {precision:6.2f}")


@pytest.mark.parametrize("part", ["all", "short"])
def test_summary_matches_sample_rsl(sample, part):
    summary = getattr(sample, part).summary()
    for key, value in SAMPLE_SUMMARY[part].items():
        assert round(summary[key], 2) == value, key


def test_report_has_evalb_summary_lines(sample):
    text = format_report(sample, SAMPLE_PRM, verbose=True)
    assert "Bracketing Recall         =  87.76" in text and "Bracketing FMeasure       =  89.12" in text
    assert text.count("\n") > 24


def test_hand_computed_collins():
    gold = "( (S (NP-SBJ (DT The) (NN cat)) (VP (VBD sat) (PRT (RP down))) (. .)) )"
    # test: NP right, VP wrong span (includes '.' but '.' is deleted so span equal), ADVP = PRT, no TOP
    test = "(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat) (ADVP (RB down)) (. .))))"
    r = score_sentence(1, gold, test, COLLINS)
    # gold brackets: S(0,4) NP(0,2) VP(2,4) PRT(3,4); test: S NP VP(2,4) ADVP(3,4) -> all 4 match
    assert (r.status, r.match, r.gold, r.test, r.crossing) == (OK, 4, 4, 4, 0)
    assert (r.words, r.correct_tags, r.length) == (4, 3, 5)  # '.' deleted from words and tags, not from length


def test_hand_computed_partial_match_and_crossing():
    gold = "(S (NP (DT a) (NN b)) (VP (VB c) (NP (DT d) (NN e))))"
    test = "(S (NP (DT a) (NN b) (VB c)) (NP (DT d) (NN e)))"
    r = score_sentence(1, gold, test, COLLINS)
    # gold: S(0,5) NP(0,2) VP(2,5) NP(3,5); test: S(0,5) NP(0,3) NP(3,5); NP(0,3) crosses VP(2,5)
    assert (r.match, r.gold, r.test, r.crossing) == (2, 4, 3, 1)
    result = evalb([gold], [test])
    assert round(result.all.recall, 2) == 50.00 and round(result.all.precision, 2) == 66.67
    assert round(result.all.f1, 2) == 57.14


def test_different_words_are_an_error_sentence_and_excluded():
    gold = ["(S (NP (NN a)) (VP (VB b)))", "(S (NP (NN a)) (VP (VB b)))", "(S (NN x))"]
    test = ["(S (NP (NN a)) (VP (VB b)))", "(S (NP (NN a)) (VP (VB c)))", ""]
    result = evalb(gold, test)
    assert [r.status for r in result.sentences] == [OK, ERROR, SKIP]
    assert "words unmatch (b|c)" in result.sentences[1].message
    assert result.all.summary()["valid_sentences"] == 1 and result.all.f1 == 100.0
    # punctuation tagged differently changes the kept words: EVALB's length error
    assert score_sentence(1, "(S (NN a) (. .))", "(S (NN a) (NN .))", COLLINS).status == ERROR
