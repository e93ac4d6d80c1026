"""The fault suite for `nmt plot`: attention on a parser draws the tree the parser would write."""

import pytest
from conftest import TINY

pytest.register_assert_rewrite("fault_checks")  # before the import, so that its asserts show their values
from fault_checks import nmt


@pytest.fixture(scope="module")
def tiny_parser(tmp_path_factory):
    tree = "((S (NP-SBJ (DT The) (NN cat)) (VP (VBZ sits) (PP-LOC (IN on) (NP (DT the) (NN mat)))) (. .)))"
    root = tmp_path_factory.mktemp("parser")
    (root / "train.tree").write_text((tree + "\n") * 20)
    (root / "train.words").write_text("The cat sits on the mat .\n" * 20)
    tree_args = ["-s", "words", "-t", "tree", "--target-format", "ptb-tree", "--vocab-size", "40"]
    assert nmt("preprocess", *tree_args, "--trainpref", root / "train", "--destdir", root / "bin").exit_code == 0
    r = nmt("train", root / "bin", "--save-dir", root / "ck", *TINY, "--max-update", 2)
    assert r.exit_code == 0, r.output
    return root / "ck" / "checkpoint_last.pt"


def test_plot_attention_on_a_parser_draws_a_tree_of_the_words(tiny_parser):
    from nmt_cli.parsing.linearize import delinearize, piece_token
    from nmt_cli.plot.attention import sentence_attention

    words = ["A", "dog", "sits", "on", "the", "mat", "."]
    att = sentence_attention(tiny_parser, " ".join(words))
    tree_pieces = [piece_token(p) for p in att.tgt_out_pieces[:-1]]  # without </s>; <(NP> spelt as (NP
    assert len(tree_pieces) <= 4 * len(words) + 4, len(tree_pieces)  # had run on to the input length + 300
    delinearize(tree_pieces, words)  # a tree of exactly these words, as generate would parse
