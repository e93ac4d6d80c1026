"""The parsing path through the CLI: preprocess trees, train a few steps, generate trees, score; bad inputs."""

import json

import pytest
from click.testing import CliRunner

from nmt_cli.cli import cli
from tests.parsing.treebank_data import TREES, preprocess, write_split


@pytest.fixture(scope="module")
def parser_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("parse")
    write_split(root / "train", 40)
    write_split(root / "valid", 4)
    result = preprocess(root, "--validpref", str(root / "valid"))
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        cli,
        [
            "train",
            str(root / "bin"),
            "--save-dir",
            str(root / "ck"),
            "--arch",
            "transformer_tiny",
            "--max-tokens",
            "400",
            "--max-update",
            "3",
            "--warmup-updates",
            "2",
            "--threads",
            "1",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    return root, root / "ck" / "checkpoint_last.pt"


def test_generate_writes_trees_with_the_input_words_and_score_reads_them(parser_checkpoint):
    root, ckpt = parser_checkpoint
    (root / "in.words").write_text("The cat sits on the mat .\nDogs bark\n\nx\n")
    result = CliRunner().invoke(
        cli, ["generate", "--path", str(ckpt), "--input", str(root / "in.words"), "--beam", "3", "--max-len-b", "12"]
    )
    assert result.exit_code == 0, result.output
    from nmt_cli.parsing.tree import parse_tree

    lines = result.stdout.splitlines()
    assert len(lines) == 4 and lines[2] == ""
    for line, words in zip(lines, ["The cat sits on the mat .", "Dogs bark", "", "x"]):
        if words:
            tree = parse_tree(line)
            assert tree.label == "TOP" and tree.words() == words.split()
    import torch

    state = torch.load(ckpt, weights_only=True)
    assert state["target_format"] == "ptb-tree" and state["search_config"]["beam"] == 21
    assert state["search_config"]["lenpen"] == 0.3 and state["search_config"]["max_len_b"] == 300
    (root / "hyp.tree").write_text("\n".join(lines[:2]) + "\n")
    (root / "gold.tree").write_text(TREES[0] + "\n" + TREES[2] + "\n")
    result = CliRunner().invoke(
        cli,
        [
            "score",
            "--metric",
            "bracket-f1",
            "--sys",
            str(root / "hyp.tree"),
            "--ref",
            str(root / "gold.tree"),
            "--verbose",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Bracketing FMeasure" in result.output and "Number of sentence        =      2" in result.output
    result = CliRunner().invoke(cli, ["score", "--sys", str(root / "hyp.tree"), "--ref", str(root / "gold.tree")])
    assert result.exit_code == 1 and "--metric bracket-f1" in result.output


def test_fallback_trees_tag_punctuation_so_evalb_scores_them(parser_checkpoint):
    """With no room for a tree (--max-len-b 3), every sentence gets the flat fallback; its punctuation had
    been tagged XX, so EVALB counted each such sentence as a length-mismatch error and left it out of F1."""
    root, ckpt = parser_checkpoint
    (root / "fb.words").write_text("The cat sits on the mat .\nIt ran away .\n")
    args = ["generate", "--path", str(ckpt), "--input", str(root / "fb.words"), "--max-len-a", "0", "--max-len-b", "3"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0 and "2 sentence(s) had no tree" in result.output, result.output
    assert result.stdout.splitlines()[1] == "(TOP (S (XX It) (XX ran) (XX away) (. .)))"
    (root / "fb.tree").write_text(result.stdout)
    (root / "fb.gold").write_text(TREES[0] + "\n" + TREES[1] + "\n")
    score = ["score", "--metric", "bracket-f1", "--sys", str(root / "fb.tree"), "--ref", str(root / "fb.gold")]
    result = CliRunner().invoke(cli, [*score, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["error_sentences"] == 0 and summary["valid_sentences"] == 2, summary


def test_words_that_normalise_to_nothing_get_a_leaf_and_a_warning_naming_their_lines(parser_checkpoint):
    """A zero-width space or a mid-file byte-order mark has no sentencepiece piece: counted as a leaf it had
    made a flat (S ...) tree with a warning blaming --max-len-a/--max-len-b, even at --max-len-b 300."""
    root, ckpt = parser_checkpoint
    lines = ["The \u200b dog runs .", "\u200b", "It ran away .", "Dogs \ufeff bark ."]
    (root / "zw.words").write_text("\n".join(lines) + "\n")
    args = ["generate", "--path", str(ckpt), "--input", str(root / "zw.words"), "--beam", "3", "--max-len-b", "300"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "no tree within the maximum length" not in result.output
    assert "3 sentence(s) hold word(s) that normalise to nothing" in result.output
    assert f"({root / 'zw.words'} lines 1, 2, 4)" in result.output
    from nmt_cli.parsing.parser import flat_tree
    from nmt_cli.parsing.tree import parse_tree

    trees = [parse_tree(line) for line in result.stdout.splitlines()]
    assert [tree.words() for tree in trees] == [line.split() for line in lines]  # a leaf per input word
    assert trees[0].tags()[1] == "XX" and trees[3].tags()[1] == "XX"
    assert str(trees[1]) == "(TOP (S (XX \u200b)))"  # nothing to parse: the flat tree
    assert str(trees[0]) != str(flat_tree(lines[0].split()))  # searched, without the word it cannot see


def test_brackets_in_words_come_out_escaped_as_the_treebank_writes_them(parser_checkpoint):
    """A raw "(" leaf had made an unbalanced line: `(VBZ () (VP (VB big) (NP (DT ))`."""
    root, ckpt = parser_checkpoint
    (root / "brackets.words").write_text("The cat ( big ) sat .\nf(x) [ y ] { z }\n")
    result = CliRunner().invoke(cli, ["generate", "--path", str(ckpt), "--input", str(root / "brackets.words")])
    assert result.exit_code == 0, result.output
    from nmt_cli.parsing.tree import parse_tree

    first, second = (parse_tree(line) for line in result.stdout.splitlines())
    assert first.words() == ["The", "cat", "-LRB-", "big", "-RRB-", "sat", "."]
    assert first.tags()[2] == "-LRB-" and first.tags()[4] == "-RRB-"  # punctuation keeps its fixed tag
    assert second.words() == ["f-LRB-x-RRB-", "-LSB-", "y", "-RSB-", "-LCB-", "z", "-RCB-"]
    assert [second.tags()[i] for i in (1, 3, 4, 6)] == ["-LRB-", "-RRB-", "-LRB-", "-RRB-"]  # as in the WSJ


def test_a_parser_needs_raw_sentences(parser_checkpoint):
    root, ckpt = parser_checkpoint
    result = CliRunner().invoke(cli, ["generate", str(root / "bin"), "--path", str(ckpt), "--gen-subset", "valid"])
    assert result.exit_code == 1 and "parsing model" in result.output


def test_parser_sampling_follows_the_seed_and_nbest_is_refused(parser_checkpoint, tmp_path):
    _, ckpt = parser_checkpoint
    words = tmp_path / "in.words"
    words.write_text("the cat sat .\na dog ran home .\nthe old man saw the young dog .\n")

    def parse(*options):
        result = CliRunner().invoke(cli, ["generate", "--path", str(ckpt), "--input", str(words), *options])
        return result.exit_code, [line for line in result.output.splitlines() if " INFO " not in line]

    runs = {seed: [parse("--sampling", "--seed", seed) for _ in range(2)] for seed in ("3", "4")}
    assert all(code == 0 for pair in runs.values() for code, _ in pair)
    assert runs["3"][0] == runs["3"][1] and runs["4"][0] == runs["4"][1]  # the seed decides the sample
    code, output = parse("--nbest", "2")
    assert code == 1 and "writes its best tree per sentence, so --nbest 2 cannot apply" in output[0]


def test_an_ensemble_of_parsers_parses_through_the_same_tree_constraint(parser_checkpoint, tmp_path):
    """Two copies of a parser parse as it does (the tree constraint only sees the search's log-probs); a parser
    beside a translation model is refused."""
    root, ckpt = parser_checkpoint
    words = tmp_path / "in.words"
    words.write_text("The cat sits on the mat .\nDogs bark\n")
    args = ["generate", "--input", str(words), "--beam", "3", "--max-len-b", "30"]
    alone = CliRunner().invoke(cli, [*args, "--path", str(ckpt)])
    twice = CliRunner().invoke(cli, [*args, "--path", f"{ckpt}:{ckpt}", "--weights", "1,1"])
    assert alone.exit_code == 0 and twice.exit_code == 0, twice.output
    assert twice.stdout == alone.stdout and len(alone.stdout.splitlines()) == 2
    assert "had no tree" not in alone.output  # searched, not the fallback
    import torch

    state = torch.load(ckpt, weights_only=True)
    state["target_format"] = None
    torch.save(state, tmp_path / "text.pt")
    mixed = CliRunner().invoke(cli, [*args, "--path", f"{ckpt}:{tmp_path / 'text.pt'}"])
    assert mixed.exit_code == 1 and "do different tasks (parsing and translation)" in mixed.output, mixed.output


def test_a_parser_refuses_min_len(parser_checkpoint):
    """--min-len beyond the tree's length left no token allowed: sampling then died in torch.multinomial."""
    root, ckpt = parser_checkpoint
    args = ["generate", "--path", str(ckpt), "--input", "-", "--sampling", "--min-len", "40"]
    result = CliRunner().invoke(cli, args, input="The cat sits .\n")
    assert result.exit_code == 1 and "so --min-len 40 cannot apply" in result.output, result.output


def test_a_parser_refuses_target_prefixes_and_the_ngram_ban(parser_checkpoint, tmp_path):
    """A tree follows its sentence's words and repeats its brackets: neither applies."""
    root, ckpt = parser_checkpoint
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("(S\n")
    base = ["generate", "--path", str(ckpt), "--input", "-"]
    result = CliRunner().invoke(cli, [*base, "--prefix-file", str(prefixes)], input="The cat sits .\n")
    assert result.exit_code == 1 and "is a parsing model" in result.output and "--prefix-file" in result.output
    result = CliRunner().invoke(cli, [*base, "--no-repeat-ngram-size", "2"], input="The cat sits .\n")
    assert result.exit_code == 1 and "--no-repeat-ngram-size 2 cannot apply" in result.output, result.output


def test_a_parser_is_not_validated_by_bleu(parser_checkpoint, tmp_path):
    root, _ = parser_checkpoint
    args = ["train", str(root / "bin"), "--save-dir", str(tmp_path / "ck"), "--arch", "transformer_tiny"]
    result = CliRunner().invoke(cli, [*args, "--max-update", "1", "--device", "cpu", "--eval-bleu"])
    assert result.exit_code == 1 and "--eval-bleu would score linearized trees as text" in result.output


def test_a_parser_is_not_exported(parser_checkpoint, tmp_path):
    """CTranslate2 would give the raw linearized pieces: no balanced brackets, no words at the leaves."""
    pytest.importorskip("ctranslate2")
    _, ckpt = parser_checkpoint
    result = CliRunner().invoke(cli, ["export", "--path", str(ckpt), "--output", str(tmp_path / "ct2")])
    assert result.exit_code == 1 and "is a parsing model" in result.output, result.output
    assert not (tmp_path / "ct2").exists()


@pytest.mark.parametrize(
    "tree, words, message",
    [
        ("(S (NN a)\n", "a\n", "train.tree:1: unbalanced brackets"),
        ("not a tree\n", "not a tree\n", "train.tree:1: not a tree"),
        ("((S (NN a)))\n((S (NN b)))\n", "a\nc\n", "train.words:2: the words do not match"),
        ("((S (-LRB- -LRB-) (NN a)))\n", "( a\n", "(word 1 is '(', the tree's leaf '-LRB-')"),
        ("((S (NN a)))\n", "a b\n", "(2 words vs 1 leaves)"),
        ("((S (NN a)))\n\n", "a\n\n", "train.tree:2: empty line"),
        ("((S (-NONE- *)))\n", "\n", "train.tree:1: the tree has no words"),
        ("((S (NN a)))\n((S (/s b)))\n", "a\nb\n", "train.tree:2: the tag /s is spelt </s> in the vocabulary, one of"),
        ("((S ( (NN a))))\n", "a\n", "train.tree:1: a bracket without a label inside the tree"),
    ],
)
def test_bad_tree_input_is_one_error_line(tmp_path, tree, words, message):
    (tmp_path / "train.tree").write_text(tree)
    (tmp_path / "train.words").write_text(words)
    result = preprocess(tmp_path)
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_bracket_scoring_refuses_translations(tmp_path):
    (tmp_path / "hyp.txt").write_text("Das ist ein Test .\n")
    (tmp_path / "gold.tree").write_text("(S (NN a))\n")
    result = CliRunner().invoke(
        cli,
        ["score", "--metric", "bracket-f1", "--sys", str(tmp_path / "hyp.txt"), "--ref", str(tmp_path / "gold.tree")],
    )
    assert result.exit_code == 1 and "hyp.txt:1: not a bracketed tree" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "hyp, gold, message",
    [
        ("", "", "gold.tree is empty; there is nothing to score"),
        ("\n\n", "\n\n", "0 error and 2 skipped (empty) sentence(s)"),
        ("(S (NN a) (NN b))\n", "(S (NN c))\n", "1 error and 0 skipped (empty) sentence(s); line 1: "),
    ],
)
def test_bracket_scoring_with_nothing_to_score_is_an_error(tmp_path, hyp, gold, message):
    """EVALB prints zeros when no sentence can be scored; `nmt score` had printed F1 0.00 and exit code 0."""
    (tmp_path / "hyp.tree").write_text(hyp)
    (tmp_path / "gold.tree").write_text(gold)
    args = [
        "score",
        "--metric",
        "bracket-f1",
        "--sys",
        str(tmp_path / "hyp.tree"),
        "--ref",
        str(tmp_path / "gold.tree"),
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and message in result.output, result.output


def test_bracket_scoring_json_has_the_short_sentences_and_with_verbose_each_one(tmp_path):
    (tmp_path / "gold.tree").write_text(TREES[0] + "\n" + TREES[1] + "\n")
    args = [
        "score",
        "--metric",
        "bracket-f1",
        "--sys",
        str(tmp_path / "gold.tree"),
        "--ref",
        str(tmp_path / "gold.tree"),
    ]
    report = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    assert report["f1"] == report["len<=40"]["f1"] == 100.0 and "per_sentence" not in report
    report = json.loads(CliRunner().invoke(cli, [*args, "--json", "--verbose"]).stdout)
    assert [r["line"] for r in report["per_sentence"]] == [1, 2] and report["per_sentence"][0]["status"] == 0


@pytest.mark.parametrize(
    "leaves, start, end",
    [
        ("words", ["<(S>", "<(NP>", "▁", "T", "he", "<DT>"], ["▁.", "<.>", "<)>"]),  # (60 pieces: ▁ T he)
        ("words-ahead", ["▁", "T", "he", "<(S>", "<(NP>", "<DT>"], ["<NN>", "▁.", "<)>", "<)>", "<)>", "<.>", "<)>"]),
    ],
)
def test_a_parser_that_copies_its_words_writes_trees_over_the_input(tmp_path, leaves, start, end):
    """--tree-leaves words: the target spells each word's pieces before its tag; words-ahead: right after the
    previous tag (before the brackets between the two words). The search copies them."""
    write_split(tmp_path / "train", 40)
    assert preprocess(tmp_path, "--tree-leaves", leaves).exit_code == 0
    from nmt_cli.data.dataset import ParallelDataset, load_vocab

    vocab, data = load_vocab(tmp_path / "bin"), ParallelDataset(tmp_path / "bin", "train")
    target = vocab.pieces(data.tgt[0])
    assert target[: len(start)] == start and target[-len(end) :] == end
    assert "".join(p for p in target if not p.startswith("<")).replace("▁", " ").split() == [
        "The",
        "cat",
        "sits",
        "on",
        "the",
        "mat",
        ".",
    ]
    args = ["--arch", "transformer_tiny", "--max-tokens", "400", "--max-update", "2", "--warmup-updates", "2"]
    train = ["train", str(tmp_path / "bin"), "--save-dir", str(tmp_path / "ck"), *args, "--threads", "1"]
    assert CliRunner().invoke(cli, [*train, "--device", "cpu"]).exit_code == 0
    # (a zero-width space has no pieces to copy: it had made the tree flat, blamed on the maximum length)
    (tmp_path / "in.words").write_text("The cat sits on the mat .\nDogs \u200b bark\nzebras , unseen ( words )\n")
    ckpt = str(tmp_path / "ck" / "checkpoint_last.pt")
    gen = ["generate", "--path", ckpt, "--input", str(tmp_path / "in.words"), "--beam", "3", "--max-len-b", "40"]
    result = CliRunner().invoke(cli, gen)
    assert result.exit_code == 0, result.output
    from nmt_cli.parsing.tree import parse_tree

    lines = result.stdout.splitlines()
    expected = ["The cat sits on the mat .", "Dogs \u200b bark", "zebras , unseen -LRB- words -RRB-"]  # z: <unk>
    assert [parse_tree(line).words() for line in lines] == [e.split() for e in expected]
    assert (
        "no tree within the maximum length" not in result.output
        and "word(s) that normalise to nothing" in result.output
        and "line 2)" in result.output
    )
    from nmt_cli.parsing.parser import flat_tree

    assert parse_tree(lines[1]).tags()[1] == "XX" and lines[1] != str(flat_tree(expected[1].split()))


def test_words_without_pieces_go_back_beside_the_word_before_them_and_the_warning_names_lines(caplog):
    from nmt_cli.parsing.parser import ParseNotes, with_words_without_pieces
    from nmt_cli.parsing.tree import parse_tree

    words = ["\ufeff", "The", "dog", "\u200b", "\u200b", "runs"]
    tree = with_words_without_pieces(
        parse_tree("(S (NP (DT The) (NN dog)) (VP (VBZ runs)))"), words, [0, 1, 1, 0, 0, 1]
    )
    assert str(tree) == "(S (NP (XX \ufeff) (DT The) (NN dog) (XX \u200b) (XX \u200b)) (VP (VBZ runs)))"
    notes = ParseNotes()
    notes.add(ParseNotes(no_pieces=[0, 2], too_long=[1]), 5)
    notes.add(ParseNotes(no_pieces=list(range(11))), 100)
    with caplog.at_level("WARNING"):
        notes.warn("in.txt")
    assert "(in.txt lines 5, 7, 100, 101, 102, 103, 104, 105, 106, 107 and 3 more)" in caplog.text
    assert "1 sentence(s) had no tree within the maximum length" in caplog.text and "(in.txt line 6)" in caplog.text
