import unicodedata

import numpy as np
import pytest

from nmt_cli.data.binarize import TokenArray, TokenWriter, token_dtype
from nmt_cli.data.dataset import ParallelDataset, load_vocab
from nmt_cli.data.vocab import BOS, EOS, PAD, UNK, Vocab
from nmt_cli.errors import DataError


def test_special_ids_are_pinned(toy_data_bin):
    vocab = load_vocab(toy_data_bin)
    assert (vocab.sp.pad_id(), vocab.sp.unk_id(), vocab.sp.bos_id(), vocab.sp.eos_id()) == (PAD, UNK, BOS, EOS)
    assert vocab.padded_size % 8 == 0 and vocab.padded_size >= vocab.n_pieces


@pytest.mark.parametrize("text", ["3 1 4 1 5", "9", "0 0 0 0 0 0 0 0 0"])
def test_sentencepiece_round_trip(toy_data_bin, text):
    vocab = load_vocab(toy_data_bin)
    assert vocab.decode(vocab.encode([text])[0]) == unicodedata.normalize("NFKC", text)


def test_binarized_ids_equal_sentencepiece_encoding(toy_data_bin, toy_corpus):
    vocab = load_vocab(toy_data_bin)
    data = ParallelDataset(toy_data_bin, "valid")
    lines = (toy_corpus / "valid.src").read_text().splitlines()
    assert len(data) == len(lines)
    expected = vocab.encode(lines)
    for i in range(len(data)):
        assert data.src[i].tolist() == expected[i]
        assert data.tgt[i].tolist() == expected[i]
    assert data.src.tokens.dtype == np.uint16


def test_one_thread_encodes_line_by_line_as_the_thread_pool_does(toy_data_bin, toy_corpus):
    """One thread: sentencepiece's per-line call, never its list call (which starts a thread pool each time,
    about 2 ms a request in a busy server); the ids are the thread pool's."""
    vocab = load_vocab(toy_data_bin)
    lines = (toy_corpus / "valid.src").read_text().splitlines() + ["", "  7  "]
    pooled = vocab.encode(lines, n_threads=2)
    calls = []
    real = vocab.sp.encode

    def spy(arg, **kwargs):
        calls.append(type(arg))
        return real(arg, **kwargs)

    vocab.sp.encode = spy
    assert vocab.encode(lines) == pooled
    assert calls == [str] * len(lines)


def test_token_writer_round_trip(tmp_path):
    sentences = [[5, 6, 7], [], [70000, 1]]
    writer = TokenWriter(tmp_path / "x", token_dtype(80000))
    writer.add(sentences[:2])
    writer.add(sentences[2:])
    assert writer.finish() == 5
    arr = TokenArray(tmp_path / "x")
    assert [arr[i].tolist() for i in range(len(arr))] == sentences
    assert arr.tokens.dtype == np.int32
    assert not (tmp_path / "x.raw").exists()


def test_not_a_sentencepiece_model():
    with pytest.raises(DataError, match="not a sentencepiece model"):
        Vocab(b"garbage", "x.model")


def test_one_corpus_gives_one_spm_model_wherever_and_however_it_is_trained(toy_corpus, tmp_path):
    """spm.model had recorded the temporary directory it was trained in and the thread count, so two runs
    of the same preprocess gave different bytes, and the vocabulary checks called them other vocabularies."""
    import sentencepiece as spm

    from nmt_cli.data.vocab import train_spm, without_run_details

    inputs = [toy_corpus / "train.src", toy_corpus / "train.tgt"]
    for name, threads in (("a", 1), ("b", 2)):
        (tmp_path / name).mkdir()
        train_spm(inputs, tmp_path / name / "spm", 24, "bpe", 1.0, 10_000, threads)
    a, b = ((tmp_path / name / "spm.model").read_bytes() for name in "ab")
    assert a == b and str(tmp_path).encode() not in a
    # what a model encodes is kept: sentencepiece's own model, before and after
    spm.SentencePieceTrainer.train(
        input=",".join(map(str, inputs)),
        model_prefix=str(tmp_path / "raw"),
        vocab_size=24,
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        minloglevel=2,
    )
    raw = (tmp_path / "raw.model").read_bytes()
    assert str(tmp_path).encode() in raw and str(tmp_path).encode() not in without_run_details(raw)
    text = (toy_corpus / "valid.src").read_text().splitlines()
    assert Vocab(raw).encode(text) == Vocab(without_run_details(raw)).encode(text)
