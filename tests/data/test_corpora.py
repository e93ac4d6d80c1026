"""Several named training corpora: preprocess binarizes them with one vocabulary (tags last in it), the dataset
reads them as one split with their sources tagged, and an epoch draws their batches by weight."""

import json

import numpy as np
import pytest
from conftest import nmt, two_corpora_bin

from nmt_cli.data.batching import draw_batches, length_batches
from nmt_cli.data.binarize import TokenArray
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.data.vocab import EOS, Vocab


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """clean (600 pairs) and bt (300) copy corpora, a valid split, preprocessed with the tag <BT>."""
    return two_corpora_bin(tmp_path_factory.mktemp("corpora"), "<BT>,<FT>")


def test_named_corpora_share_one_vocabulary_with_the_tags_last(two_corpora):
    meta = json.loads((two_corpora / "meta.json").read_text())
    assert list(meta["splits"]) == ["train.clean", "train.bt", "valid"]
    assert meta["splits"]["train.clean"]["pairs"] == 600 and meta["splits"]["train.bt"]["pairs"] == 300
    vocab = Vocab.load(two_corpora / "spm.model")
    assert vocab.tags == ["<BT>", "<FT>"] and vocab.n_outputs == vocab.n_pieces - 2 == 22
    assert vocab.sp.piece_to_id("<BT>") == 22
    encoded = vocab.encode(["<BT> 1 2 <FT>"])[0]  # text never encodes to a tag
    assert all(i < vocab.n_outputs for i in encoded)
    assert vocab.decode([22, *vocab.encode(["3 4"])[0]]) == "3 4"


def test_the_split_train_is_every_corpus_with_tagged_sources(two_corpora):
    plain = ParallelDataset(two_corpora, "train")
    assert len(plain) == 900 and plain.corpora == {"clean": range(0, 600), "bt": range(600, 900)}
    tagged = ParallelDataset(two_corpora, "train", {"bt": 22})
    assert np.array_equal(tagged.src_lens[:600], plain.src_lens[:600])
    assert np.array_equal(tagged.src_lens[600:], plain.src_lens[600:] + 1)
    assert np.array_equal(tagged.tgt_lens, plain.tgt_lens)
    for i in (0, 599, 600, 899):
        expected = plain.src[i] if i < 600 else np.concatenate(([22], plain.src[i]))
        assert np.array_equal(tagged.src[i], expected) and np.array_equal(tagged.tgt[i], plain.tgt[i])
    assert isinstance(ParallelDataset(two_corpora, "valid").src, TokenArray)


def test_one_unnamed_corpus_reads_as_before(toy_data_bin):
    data = ParallelDataset(toy_data_bin, "train")
    assert data.corpora == {"train": range(len(data))} and isinstance(data.src, TokenArray)


def corpora_lengths(sizes, seed=0):
    rng = np.random.default_rng(seed)
    lens = [(rng.integers(0, 40, n), rng.integers(0, 40, n)) for n in sizes]
    starts = np.cumsum([0, *sizes])
    return [
        [b + start for b in length_batches(src, tgt, 400, 7, corpus=k)]
        for k, ((src, tgt), start) in enumerate(zip(lens, starts))
    ]


@pytest.mark.parametrize("weights", [[2.0, 1.0], [1.0, 0.5], [0.3, 3.0], [1.0, 0.0]])
def test_an_epoch_draws_each_corpus_by_weight_times_size(weights):
    sizes = [3000, 2000]
    corpora = corpora_lengths(sizes)
    drawn, n_pairs = draw_batches(corpora, weights, np.random.default_rng([7, 1]))
    ids = np.concatenate(drawn)
    counts = [int((ids < sizes[0]).sum()), int((ids >= sizes[0]).sum())]
    assert counts == n_pairs
    wanted = [w * n for w, n in zip(weights, sizes)]
    for count, want in zip(counts, wanted):
        assert abs(count / sum(counts) - want / sum(wanted)) < 0.05
    if weights[1] == 0.5:  # a different half of the second corpus each epoch; the same again for the same epoch
        again, _ = draw_batches(corpora, weights, np.random.default_rng([7, 1]))
        other, _ = draw_batches(corpora, weights, np.random.default_rng([7, 2]))
        assert all(np.array_equal(a, b) for a, b in zip(drawn, again))
        assert set(np.concatenate(other).tolist()) != set(ids.tolist())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trainpref", "a b=x"], "corpus name 'a b'"),
        (["--trainpref", "a=x,a=y"], "repeated"),
        (["--trainpref", "a=x,y"], "'y' is empty, repeated or not NAME=VALUE"),
        (["--trainpref", "a=x", "--target-format", "ptb-tree"], "one unnamed --trainpref"),
        (["--trainpref", "x", "--tags", "<BT>,,<FT>"], "--tags"),
    ],
)
def test_bad_corpus_options_are_one_error_line(tmp_path, args, message):
    result = nmt("preprocess", "-s", "src", "-t", "tgt", "--destdir", tmp_path / "bin", *args)
    assert result.exit_code == 1 and message in result.output, result.output
    assert result.output.count("error:") == 1 and "Traceback" not in result.output


def test_a_given_model_must_hold_the_tags(toy_corpus, toy_data_bin, tmp_path):
    result = nmt(
        *("preprocess", "-s", "src", "-t", "tgt", "--trainpref", toy_corpus / "train", "--destdir", tmp_path / "b"),
        *("--spm-model", toy_data_bin / "spm.model", "--tags", "<BT>"),
    )
    assert result.exit_code == 1 and "has the tags none, not all of --tags <BT>" in result.output, result.output
    assert Vocab.load(toy_data_bin / "spm.model").n_outputs > EOS
