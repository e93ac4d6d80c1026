"""`nmt plot attention` and `nmt plot curves`: files are written, and what is drawn is what the model
used and what the log holds (compared as numbers, not pixels)."""

import json
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from nmt_cli.cli import cli
from nmt_cli.plot.attention import KINDS, plot_attention, sentence_attention
from nmt_cli.plot.curves import plot_curves, read_log

pytest.importorskip("matplotlib")


def test_sentence_attention_is_the_forward_pass(tiny_checkpoint):
    att = sentence_attention(tiny_checkpoint, "3 1 4 1 5")
    assert att.src_pieces[-1] == "</s>" and att.tgt_in_pieces[0] == "<s>" and att.tgt_out_pieces[-1] == "</s>"
    assert len(att.tgt_in_pieces) == len(att.tgt_out_pieces)
    s, t = len(att.src_pieces), len(att.tgt_out_pieces)
    for kind, shape in (("encoder", (2, s, s)), ("decoder", (2, t, t)), ("cross", (2, t, s))):
        assert len(att.weights[kind]) == 2
        for w in att.weights[kind]:
            assert w.shape == shape
            torch.testing.assert_close(w.sum(-1), torch.ones(shape[:-1]))
    assert (att.weights["decoder"][0].triu(1) == 0).all()


def test_a_sentence_longer_than_the_model_is_cut_as_generate_cuts_it(tiny_checkpoint):
    from nmt_cli.checkpoint import load_checkpoint

    limit = load_checkpoint(tiny_checkpoint)["model_config"]["max_positions"] - 1
    att = sentence_attention(tiny_checkpoint, " ".join(["1"] * (limit + 20)))  # a traceback before
    assert len(att.src_pieces) == limit + 1  # the pieces that fit, and </s>


def test_plot_attention_draws_the_recorded_weights(trained_copy_checkpoint, tmp_path):
    # the trained copy model ends its translation after the copy: maps of a few rows, where the barely trained
    # one runs to its length limit and the figure, sized by the pieces, takes most of the test's time to draw
    att = sentence_attention(trained_copy_checkpoint, "2 7 1 8")
    assert len(att.tgt_out_pieces) < 12, att.tgt_out_pieces
    fig = plot_attention(att, None, None, tmp_path / "all.png")
    assert (tmp_path / "all.png").stat().st_size > 1000
    axes = fig.axes
    assert len(axes) == 3 * 2  # three kinds x two heads of the last layer
    for i, kind in enumerate(KINDS):
        for h in range(2):
            ax = axes[i * 2 + h]
            np.testing.assert_array_equal(ax.images[0].get_array(), att.weights[kind][1][h].numpy())
            keys, queries = att.keys_and_queries(kind)
            assert [t.get_text() for t in ax.get_xticklabels()] == keys
            assert [t.get_text() for t in ax.get_yticklabels()] == queries
    fig = plot_attention(att, 1, 2, tmp_path / "one.svg")
    assert len(fig.axes) == 3 and (tmp_path / "one.svg").read_text().lstrip().startswith("<?xml")
    np.testing.assert_array_equal(fig.axes[2].images[0].get_array(), att.weights["cross"][0][1].numpy())


def test_plot_attention_cli(trained_copy_checkpoint, tmp_path):  # short maps, as above
    out = tmp_path / "att.png"
    result = CliRunner().invoke(
        cli,
        [
            "plot",
            "attention",
            "--path",
            str(trained_copy_checkpoint),
            "--input",
            "1 2 3",
            "--layer",
            "2",
            "--head",
            "1",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for args, message in (
        (["--layer", "3"], "--layer 3 is out of range"),
        (["--head", "9"], "--head 9 is out"),
        (["--head", "x"], "--head 'x' must be"),
        (["--output", str(tmp_path / "a.jpg")], "must end in"),
    ):
        argv = ["plot", "attention", "--path", str(trained_copy_checkpoint), "--input", "1 2", "--output", str(out)]
        argv += args
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 1 and message in result.output, result.output


def write_log(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def fake_run(n, bleu=True, offset=0.0):
    records = []
    for u in range(10, 10 * n + 1, 10):
        records.append(
            {
                "event": "train",
                "update": u,
                "epoch": 1,
                "elapsed_s": u * 0.7 + offset,
                "loss": 9 - u / 20,
                "nll_loss": 8 - u / 20,
                "ppl": 100.0,
                "tgt_tok_per_s": 5000 + u,
                "grad_norm": 1.0,
                "lr": u * 1e-5,
                "skipped": 0,
            }
        )
        if u % 20 == 0:
            valid = {
                "event": "valid",
                "update": u,
                "epoch": 1,
                "elapsed_s": u * 0.7 + 1,
                "valid_loss": 8.5 - u / 25,
                "valid_nll": 8.0,
                "valid_ppl": 3000.0,
                "best": 1.0,
            }
            if bleu:
                valid["valid_bleu"] = u / 10
            records.append(valid)
    return records


def test_plot_curves_draws_the_logged_numbers(tmp_path):
    write_log(tmp_path / "a.jsonl", fake_run(6))
    write_log(tmp_path / "b.jsonl", fake_run(4, bleu=False, offset=3.0))
    runs = [read_log(tmp_path / "a.jsonl"), read_log(tmp_path / "b.jsonl", "second")]
    drawn = plot_curves(runs, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 1000
    a = fake_run(6)
    train = [r for r in a if r["event"] == "train"]
    valid = [r for r in a if r["event"] == "valid"]
    assert drawn[("a", "train", "loss", "update")] == ([r["update"] for r in train], [r["loss"] for r in train])
    assert drawn[("a", "valid", "valid_loss", "update")] == (
        [r["update"] for r in valid],
        [r["valid_loss"] for r in valid],
    )
    assert drawn[("a", "valid", "valid_bleu", "elapsed_s")] == (
        [r["elapsed_s"] / 60 for r in valid],
        [r["valid_bleu"] for r in valid],
    )
    assert drawn[("second", "train", "tgt_tok_per_s", "update")][1] == [5010, 5020, 5030, 5040]
    assert drawn[("second", "train", "lr", "elapsed_s")][0] == [
        r["elapsed_s"] / 60 for r in fake_run(4, offset=3.0) if r["event"] == "train"
    ]
    assert ("second", "valid", "valid_bleu", "update") not in drawn


def test_plot_curves_of_a_real_log(toy_data_bin, tmp_path):
    from conftest import tiny_train_config

    from nmt_cli.commands.train import train
    from nmt_cli.config import SearchConfig, model_config

    log = tmp_path / "run.jsonl"
    train(
        tiny_train_config(toy_data_bin, tmp_path / "ckpt", max_update=4, log_interval=2, log_file=str(log)),
        model_config("transformer_tiny"),
        SearchConfig(),
    )
    out = tmp_path / "c.png"
    result = CliRunner().invoke(
        cli,
        [
            "plot",
            "curves",
            "--log-file",
            str(log),
            "--log-file",
            str(log),
            "--label",
            "one",
            "--label",
            "two",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    drawn = plot_curves([read_log(log)], tmp_path / "c2.png")
    assert drawn[("run", "train", "loss", "update")][1] == [r["loss"] for r in logged if r["event"] == "train"]
    assert drawn[("run", "valid", "valid_loss", "update")][1] == [
        r["valid_loss"] for r in logged if r["event"] == "valid"
    ]


def test_a_resumed_runs_records_replace_those_past_its_checkpoint(tmp_path):
    """Killed after update 60, resumed from the checkpoint at 40: the log holds 10..60 and then 50..80 again."""
    first = fake_run(6)
    resumed = [dict(r, loss=r["loss"] - 1) if "loss" in r else r for r in fake_run(8) if r["update"] > 40]
    write_log(tmp_path / "run.jsonl", first + resumed)
    drawn = plot_curves([read_log(tmp_path / "run.jsonl")], tmp_path / "run.png")
    updates, losses = drawn[("run", "train", "loss", "update")]
    assert updates == [10, 20, 30, 40, 50, 60, 70, 80]
    assert losses == [9 - u / 20 for u in (10, 20, 30, 40)] + [8 - u / 20 for u in (50, 60, 70, 80)]
    assert drawn[("run", "valid", "valid_loss", "update")][0] == [20, 40, 60, 80]


def test_a_log_with_only_validations_still_plots(tmp_path):
    write_log(tmp_path / "short.jsonl", [r for r in fake_run(4) if r["event"] == "valid"])
    drawn = plot_curves([read_log(tmp_path / "short.jsonl")], tmp_path / "short.png")
    assert set(drawn) == {
        ("short", "valid", f, x) for f in ("valid_loss", "valid_bleu") for x in ("update", "elapsed_s")
    }


def test_plot_curves_errors(tmp_path):
    (tmp_path / "bad.jsonl").write_text("not json\n")
    write_log(tmp_path / "ok.jsonl", fake_run(2))
    runner = CliRunner()
    result = runner.invoke(cli, ["plot", "curves", "--log-file", str(tmp_path / "bad.jsonl"), "--output", "x.png"])
    assert result.exit_code == 1 and "bad.jsonl:1 is not JSON" in result.output
    (tmp_path / "empty.jsonl").write_text("")
    result = runner.invoke(cli, ["plot", "curves", "--log-file", str(tmp_path / "empty.jsonl"), "--output", "x.png"])
    assert result.exit_code == 1 and "empty.jsonl is empty" in result.output
    result = runner.invoke(
        cli,
        [
            "plot",
            "curves",
            "--log-file",
            str(tmp_path / "ok.jsonl"),
            "--label",
            "a",
            "--label",
            "b",
            "--output",
            "x.png",
        ],
    )
    assert result.exit_code == 1 and "one --label per --log-file" in result.output
    result = runner.invoke(cli, ["plot", "curves", "--log-file", str(tmp_path / "missing.jsonl"), "--output", "x.png"])
    assert result.exit_code == 1 and f"error: --log-file {tmp_path / 'missing.jsonl'} does not exist" in result.output


def test_plot_curves_refuses_records_without_numbers(tmp_path):
    """A record without elapsed_s was a KeyError traceback, a string update a TypeError, and a string loss
    was drawn on a category axis without a word."""
    good = {"event": "train", "update": 5, "epoch": 1, "elapsed_s": 3.0, "loss": 3.0}
    cases = [
        ({k: v for k, v in good.items() if k != "elapsed_s"}, "log.jsonl:1 is not an nmt train log record"),
        ({**good, "update": "5"}, "log.jsonl:1: update is '5', not a number"),
        ({**good, "loss": "3.0"}, "log.jsonl:1: loss is '3.0', not a number"),
    ]
    for record, message in cases:
        (tmp_path / "log.jsonl").write_text(json.dumps(record) + "\n")
        args = ["plot", "curves", "--log-file", str(tmp_path / "log.jsonl"), "--output", str(tmp_path / "c.png")]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1 and message in result.output, result.output


def test_plot_attention_input_naming_a_file_is_refused(tiny_checkpoint, tmp_path):
    """generate --input takes a file; plot attention's takes the sentence, and drew the file's name."""
    (tmp_path / "test.en").write_text("1 2 3\n")
    args = ["plot", "attention", "--path", str(tiny_checkpoint), "--input", str(tmp_path / "test.en")]
    result = CliRunner().invoke(cli, [*args, "--output", str(tmp_path / "a.png")])
    assert result.exit_code == 1 and "names a file, and plot attention draws the sentence given" in result.output


def test_without_matplotlib_one_error_line(tmp_path, monkeypatch):
    write_log(tmp_path / "ok.jsonl", fake_run(2))
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(
        cli, ["plot", "curves", "--log-file", str(tmp_path / "ok.jsonl"), "--output", str(tmp_path / "c.png")]
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ['error: nmt plot needs matplotlib: pip install "nmt[plot]"']
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("command", [["plot"], ["plot", "attention"], ["plot", "curves"]])
def test_help(command):
    assert CliRunner().invoke(cli, [*command, "--help"]).exit_code == 0
