"""The parsing vocabulary: every character of the sentences has a piece; tree tokens are target-only symbols."""

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SHARED_DATA

from nmt_cli.cli import cli
from nmt_cli.data.dataset import ParallelDataset, load_vocab
from nmt_cli.data.vocab import EOS, UNK, Vocab, train_spm
from nmt_cli.parsing.parser import tree_tokens

PTB = SHARED_DATA / "ptb-sample"
# Words that are also tags or hold their characters: , . : $ # and the . inside abbreviations.
TREES = [
    "((S (NP (NNP Mr.) (NNP Vinken)) (VP (VBZ is) (NP ($ $) (CD 5))) (. .)))",
    "((S (NP (NNS Rates)) (, ,) (VP (VBD rose) (NP (# #) (CD 3)) (: :) (NP (NN N.V.))) (. .)))",
]


def preprocess_trees(prefix: Path, dest: Path, vocab_size: int) -> None:
    args = ["preprocess", "-s", "words", "-t", "tree", "--target-format", "ptb-tree", "--trainpref", str(prefix)]
    result = CliRunner().invoke(cli, [*args, "--destdir", str(dest), "--vocab-size", str(vocab_size)])
    assert result.exit_code == 0, result.output


def test_punctuation_words_are_spelt_and_tags_are_single_target_symbols(tmp_path):
    (tmp_path / "train.tree").write_text("\n".join(TREES * 3) + "\n")
    preprocess_trees(tmp_path / "train", tmp_path / "bin", 60)
    vocab = load_vocab(tmp_path / "bin")
    for sentence in ("Mr. Vinken is $ 5 .", "Rates , rose # 3 : N.V. ."):
        ids = vocab.encode([sentence])[0]
        assert UNK not in ids and not any(vocab.sp.is_control(i) for i in ids), vocab.pieces(ids)
        assert vocab.decode(ids) == sentence
    tokens = tree_tokens(vocab)
    for tag in (",", ".", ":", "$", "#", "(S", ")", "NNP"):
        assert tokens.count(tag) == 1
    data = ParallelDataset(tmp_path / "bin", "train")
    first_tree = [tokens[i] for i in data.tgt[0]]
    assert first_tree == ["(S", "(NP", "NNP", "NNP", ")", "(VP", "VBZ", "(NP", "$", "CD", ")", ")", ".", ")"]


def test_bare_tree_tokens_of_older_vocabularies_are_still_read(tmp_path):
    (tmp_path / "words.txt").write_text("a b c\n" * 20)
    train_spm([tmp_path / "words.txt"], tmp_path / "spm", 12, "bpe", 1.0, 1000, control_symbols=["(S", ")", "NN"])
    tokens = tree_tokens(Vocab.load(tmp_path / "spm.model"))
    assert tokens[EOS + 1 : EOS + 4] == ["(S", ")", "NN"] and set(tokens[EOS + 4 :]) == {""}


@pytest.mark.skipif(not (PTB / "train.tree").exists(), reason="ptb-sample is absent")
def test_no_unk_in_the_ptb_sample_sentences(tmp_path):
    """8% of the source pieces were <unk>: every , and . (tags spelt bare took the characters' pieces)."""
    for kind in ("tree", "words"):
        (tmp_path / f"train.{kind}").symlink_to(PTB / f"train.{kind}")
    preprocess_trees(tmp_path / "train", tmp_path / "bin", 4000)
    vocab = load_vocab(tmp_path / "bin")
    sentences = (PTB / "train.words").read_text(encoding="utf-8").splitlines()
    encoded = vocab.encode(sentences)
    assert sum(ids.count(UNK) for ids in encoded) == 0
    assert int(np.count_nonzero(ParallelDataset(tmp_path / "bin", "train").src.tokens == UNK)) == 0
