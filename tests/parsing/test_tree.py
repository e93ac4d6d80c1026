"""Tree reading, printing and cleaning; linearisation round trips on every ptb-sample tree."""

import re

import pytest
from conftest import SHARED_DATA

from nmt_cli.errors import DataError
from nmt_cli.parsing.linearize import SLOT, delinearize, linearize, tag_punctuation, with_top
from nmt_cli.parsing.tree import TreeSyntaxError, clean, parse_tree, read_trees, strip_function_tag

PTB = SHARED_DATA / "ptb-sample"
needs_ptb = pytest.mark.skipif(not (PTB / "train.tree").exists(), reason=f"{PTB} is absent")


def test_parse_print_round_trip():
    text = "(S (NP-SBJ (DT The) (NN cat)) (VP (VBZ sits)) (. .))"
    assert str(parse_tree(text)) == text
    assert parse_tree("((S (NN x)))").label == ""
    assert parse_tree("(S (NP (NN a) (NN b)))").words() == ["a", "b"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty line"),
        ("hello world", "not a tree"),
        ("(S (NN a)", "never closed"),
        ("(S (NN a)))", "too many ')'"),
        ("(S (NP) (NN a))", "empty constituent"),
        ("(S (NN a) b)", "outside"),
        ("(S (NN a)) (S (NN b))", "after the end"),
        ("((S ( (NN a)) (NN b)))", "a bracket without a label inside the tree"),
        ("(S (-LRB- () (NN b))", "a word '(' or ')' is written -LRB- or -RRB-"),
        ("(S " * 501 + "(NN a)" + ")" * 501, "nests deeper than 500 levels"),
    ],
)
def test_malformed_trees(text, message):
    with pytest.raises(TreeSyntaxError, match=re.escape(message)):
        parse_tree(text)


def test_deep_trees_are_read_cleaned_linearised_and_printed():
    """A tree 400 levels deep (recursion had ended at about 340 in a traceback), and a 5,000-level one as the
    search may build it, printed and walked without recursion."""
    text = "(S " * 400 + "(NN a)" + ")" * 400
    tree = clean(parse_tree(text))
    assert str(tree) == text and tree.words() == ["a"] and len(linearize(tree, "pos")) == 801
    built = delinearize(["(S"] * 5000 + ["NN"] + [")"] * 5000, ["a"])
    assert str(built) == "(S " * 5000 + "(NN a)" + ")" * 5000 and tag_punctuation(built).words() == ["a"]


def test_read_trees_names_file_and_line(tmp_path):
    path = tmp_path / "x.tree"
    path.write_text("(S (NN a))\n(S (NN b)\n")
    with pytest.raises(DataError, match=r"x.tree:2: unbalanced"):
        read_trees(path)


def test_clean_strips_function_tags_none_and_empty_constituents():
    tree = parse_tree("( (S (NP-SBJ-1 (-NONE- *)) (VP=2 (VBD reported) (SBAR (-NONE- 0) (S (-NONE- *T*-1)))) (. .)) )")
    assert str(clean(tree)) == "(S (VP (VBD reported)) (. .))"
    assert strip_function_tag("-NONE-") == "-NONE-" and strip_function_tag("PP-LOC-CLR") == "PP"
    assert clean(parse_tree("((X (-NONE- *)))")) is None
    assert str(clean(parse_tree("( (S (NN a)) (. .) )"))) == "(TOP (S (NN a)) (. .))"


def test_linearize_modes():
    tree = clean(parse_tree("((S (NP (DT The) (NN cat)) (VP (VBZ sits)) (. .)))"))
    assert " ".join(linearize(tree, "pos")) == "(S (NP DT NN ) (VP VBZ ) . )"
    assert " ".join(linearize(tree, "slot")) == "(S (NP XX XX ) (VP XX ) . )"
    back = delinearize(linearize(tree, "pos"), ["The", "cat", "sits", "."])
    assert str(with_top(back)) == "(TOP (S (NP (DT The) (NN cat)) (VP (VBZ sits)) (. .)))"


@pytest.mark.parametrize(
    "tokens, words",
    [
        ("(S XX", ["a"]),
        ("(S XX ) )", ["a"]),
        ("(S )", []),
        ("(S XX XX )", ["a"]),
        ("XX", ["a"]),
        ("(S XX ) (S XX )", ["a", "b"]),
    ],
)
def test_delinearize_rejects_malformed(tokens, words):
    with pytest.raises(ValueError):
        delinearize(tokens.split(), words)


@needs_ptb
def test_round_trip_on_every_sample_tree():
    kept = {SLOT, ",", ":", "``", "''", ".", "-LRB-", "-RRB-", "#", "$"}
    for split in ("train", "valid"):
        trees = read_trees(PTB / f"{split}.tree")
        words = (PTB / f"{split}.words").read_text().splitlines()
        for tree, line in zip(trees, words):
            cleaned = clean(tree)
            assert cleaned.words() == line.split()
            assert str(delinearize(linearize(cleaned, "pos"), line.split())) == str(cleaned)
            slot = linearize(cleaned, "slot")
            back = delinearize(slot, line.split())  # same brackets; tags are XX except punctuation
            assert linearize(back, "slot") == slot and set(back.tags()) <= kept


def test_punctuation_words_get_their_fixed_tag():
    tree = delinearize(
        ["(S", "(NP", "NN", "NN", "NN", ")", "VB", "NN", "NN", ",", ",", ")"],
        ["``", "a", ",", "b", "'", ".", "Calif.", "$"],
    )
    assert tag_punctuation(tree).tags() == ["``", "NN", ",", "VB", "NN", ".", SLOT, SLOT]
