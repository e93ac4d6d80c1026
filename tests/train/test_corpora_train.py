"""`nmt train --train-weights --corpus-tags` on several named corpora: the epoch's draw logged per corpus, exact
resume, the user's errors; `nmt generate` never outputs a tag."""

import json

import pytest
import torch
from conftest import ONE_ROUTE, TINY, nmt, two_corpora_bin

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.data.vocab import Vocab

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


@pytest.fixture(scope="module")
def corpora_bin(tmp_path_factory):
    """clean (600 pairs) and bt (300) copy corpora and a valid split, preprocessed with the tag <BT>."""
    return two_corpora_bin(tmp_path_factory.mktemp("corpora"), "<BT>")


def train(data, save, *args):
    return nmt("train", data, "--save-dir", save, *TINY, *args)


def test_weights_and_tags_train_and_log_the_draw_per_corpus(corpora_bin, tmp_path):
    result = train(corpora_bin, tmp_path, "--max-epoch", 1, "--train-weights", "clean=2", "--corpus-tags", "bt=<BT>")
    assert result.exit_code == 0, result.output
    assert "epoch 1 draws pairs by corpus: clean 2 x 600 = 1,200 (80.0%), bt 1 x 300 = 300 (20.0%)" in result.output
    saved = load_checkpoint(tmp_path / "checkpoint_last.pt")["train_config"]
    assert saved["train_weights"] == "clean=2" and saved["corpus_tags"] == "bt=<BT>"


def test_an_old_single_corpus_data_dir_trains_with_a_weight(toy_data_bin, tmp_path):
    result = train(
        toy_data_bin, tmp_path, "--max-epoch", 1, "--train-weights", "train=0.5", "--log-file", tmp_path / "l"
    )
    assert result.exit_code == 0, result.output
    assert "draws pairs by corpus" not in result.output  # one corpus: nothing to compare
    pairs = json.loads((toy_data_bin / "meta.json").read_text())["splits"]["train"]["pairs"]
    whole = train(toy_data_bin, tmp_path / "whole", "--max-epoch", 1)
    assert whole.exit_code == 0
    updates = [load_checkpoint(d / "checkpoint_last.pt")["update"] for d in (tmp_path, tmp_path / "whole")]
    assert 0.4 < updates[0] / updates[1] < 0.6 and pairs > 1000


@ONE_ROUTE  # the subject is the epochs' draws, made on the host
def test_resume_is_exact_across_epochs_with_a_fractional_weight(corpora_bin, tmp_path):
    args = ("--train-weights", "bt=0.5,clean=0.7", "--corpus-tags", "bt=<BT>", "--seed", 3)
    assert train(corpora_bin, tmp_path / "once", *args, "--max-update", 55).exit_code == 0
    assert train(corpora_bin, tmp_path / "twice", *args, "--max-update", 31).exit_code == 0
    assert train(corpora_bin, tmp_path / "twice", *args, "--max-update", 55).exit_code == 0
    once, twice = (load_checkpoint(tmp_path / d / "checkpoint_last.pt") for d in ("once", "twice"))
    assert once["epoch"] == twice["epoch"] > 2
    for name, weight in once["model"].items():
        assert torch.equal(weight, twice["model"][name]), name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--train-weights", "news=2"], "--train-weights: {data} has no training corpus 'news'; it has clean, bt"),
        (["--corpus-tags", "news=<BT>"], "--corpus-tags: {data} has no training corpus 'news'"),
        (["--corpus-tags", "bt=<FT>"], "'<FT>' is not a tag of {data}'s vocabulary (it has <BT>)"),
        (["--train-weights", "bt=x"], "--train-weights bt=x: a weight is a number >= 0"),
        (["--train-weights", "bt=-1"], "--train-weights bt=-1: a weight is a number >= 0"),
        (["--train-weights", "bt=nan"], "a weight is a number >= 0"),
        (["--train-weights", "bt"], "'bt' is empty, repeated or not NAME=VALUE"),
        (["--train-weights", "bt=0,clean=0"], "leaves every training corpus at weight 0"),
    ],
)
def test_bad_corpus_options_are_one_error_line(corpora_bin, tmp_path, args, message):
    result = train(corpora_bin, tmp_path, "--max-update", 1, *args)
    assert result.exit_code == 1 and message.format(data=corpora_bin) in result.output, result.output
    assert result.output.count("error:") == 1 and "Traceback" not in result.output


def test_generate_never_outputs_a_tag(corpora_bin, tmp_path):
    """A model whose every step scores the tag far above all else: each search takes the best other piece."""
    args = ("--normalize-before", "--corpus-tags", "bt=<BT>", "--max-update", 2)
    assert train(corpora_bin, tmp_path, *args).exit_code == 0
    ckpt = load_checkpoint(tmp_path / "checkpoint_last.pt")
    weights, tag = ckpt["model"], Vocab(ckpt["spm_model"]).sp.piece_to_id("<BT>")
    direction = torch.ones_like(weights["decoder_norm.bias"])
    weights["decoder_norm.weight"].zero_()  # every step's output is `direction`: its logits rank the tag first
    weights["decoder_norm.bias"].copy_(direction)
    for name, tensor in weights.items():
        if tensor.dim() == 2 and tensor.shape[0] == ckpt["model_config"]["vocab_size"]:
            tensor[tag] = 10 * direction
    torch.save(ckpt, tmp_path / "tag.pt")
    (tmp_path / "in.txt").write_text("1 2 3\n4 5\n")
    for search in (["--beam", 2], ["--beam", 1], ["--sampling", "--beam", 1]):
        result = nmt(
            *("generate", "--path", tmp_path / "tag.pt", "--input", tmp_path / "in.txt", "--device", "cpu"),
            *("--output-format", "jsonl", "--max-len-a", 0, "--max-len-b", 5, *search),
        )
        assert result.exit_code == 0, result.output
        records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        tokens = [t for r in records for h in r["hypotheses"] for t in h["tokens"]]
        assert len(records) == 2 and tokens and "<BT>" not in tokens, search
