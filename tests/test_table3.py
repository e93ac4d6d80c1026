"""recipes/table3: every row's settings are `nmt train` flags, the table prints in the paper's layout, and
(slow) QUICK=1 runs end to end on Multi30k."""

import importlib.util
import json
import shlex
import subprocess

import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT, SHARED_DATA, fake_cpuinfo, recipe_env

from nmt_cli.cli import cli
from nmt_cli.cli.train import train as train_command
from nmt_cli.config import ModelConfig, model_config
from nmt_cli.model.transformer import build_model, count_parameters

RECIPE = ROOT / "recipes" / "table3"


def dry_run_train_commands(tmp_path, **kw):
    (tmp_path / "work" / "data-bin").mkdir(parents=True)
    (tmp_path / "work" / "data-bin" / "meta.json").write_text("{}")
    run = subprocess.run(
        ["bash", str(RECIPE / "run.sh")],
        env=recipe_env(WORK_DIR=str(tmp_path / "work"), DRY_RUN="1", **kw),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return [shlex.split(line[2:])[2:] for line in run.stderr.splitlines() if line.startswith("+ nmt train ")]


def test_every_row_is_nmt_train_flags(tmp_path):
    cpuinfo = fake_cpuinfo(tmp_path, "fpu avx2 avx512f avx512_bf16")  # bfloat16 instructions: --bf16
    commands = dry_run_train_commands(tmp_path, CPUINFO=cpuinfo)
    rows = [
        line.split()[0]
        for line in (RECIPE / "rows.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(commands) == len(rows) == 17
    seen = {}
    for args in commands:
        ctx = train_command.make_context("train", list(args))
        p = ctx.params
        assert p["max_time_minutes"] == 3 and (p["bf16"] or p["precision"] == "bf16")
        model_flags = {f: p[f] for f in ModelConfig.__dataclass_fields__ if f in p and f != "arch"}
        cfg = model_config(p["arch"], vocab_size=8000, **model_flags)  # validates the row
        seen[args[args.index("--save-dir") + 1].split("/")[-2]] = (cfg, p["label_smoothing"])
    base, _ = seen["base"]
    assert (base.heads, base.d_model, base.d_ff, base.encoder_layers, base.dropout) == (4, 256, 1024, 3, 0.1)
    assert [seen[f"A_h{h}"][0].heads for h in (1, 8, 16)] == [1, 8, 16]
    assert [seen[f"B_dk{k}"][0].attention_key_dim for k in (16, 32)] == [16, 32]
    assert seen["C_N2"][0].decoder_layers == 2 and seen["C_d512"][0].d_model == 512 and seen["C_ff2048"][0].d_ff == 2048
    assert seen["D_drop0"][0].dropout == 0.0 and seen["D_ls0.2"][1] == 0.2
    assert seen["E_learned"][0].learned_pos


def test_quick_selects_the_quick_rows_at_a_minute(tmp_path):
    commands = dry_run_train_commands(tmp_path, QUICK="1")
    assert [a[a.index("--save-dir") + 1].split("/")[-2] for a in commands] == ["base", "B_dk16"]
    assert all(a[a.index("--max-time-minutes") + 1] == "1" for a in commands)


def test_rows_picks_rows_by_name_and_refuses_a_misspelt_one(tmp_path):
    commands = dry_run_train_commands(tmp_path, ROWS="A:h8 D:drop0.2")
    assert [a[a.index("--save-dir") + 1].split("/")[-2] for a in commands] == ["A_h8", "D_drop0.2"]
    env = recipe_env(WORK_DIR=str(tmp_path / "work"), DRY_RUN="1", ROWS="base D:drop0x2")
    run = subprocess.run(["bash", str(RECIPE / "run.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "no row 'D:drop0x2'" in run.stderr, run.stderr


def test_key_dim_and_learned_positions_train_and_translate(toy_data_bin, tmp_path):
    save = tmp_path / "ckpt"
    result = CliRunner().invoke(
        cli,
        [
            "train",
            str(toy_data_bin),
            "--save-dir",
            str(save),
            "--arch",
            "transformer_tiny",
            "--attention-key-dim",
            "4",
            "--heads",
            "2",
            "--learned-pos",
            "--max-update",
            "2",
            "--max-tokens",
            "512",
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((save / "config.json").read_text())["model"]["attention_key_dim"] == 4
    result = CliRunner().invoke(
        cli,
        ["generate", "--path", str(save / "checkpoint_last.pt"), "--input", "-", "--beam", "2", "--max-len-b", "3"],
        input="1 2 3\n4 5\n",
    )
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2


def load_table_module():
    spec = importlib.util.spec_from_file_location("table3_table", RECIPE / "table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_row(work, name, model, label_smoothing, ppl, bleu):
    d = work / "rows" / name.replace(":", "_")
    (d / "checkpoints").mkdir(parents=True)
    cfg = model_config("transformer_small", vocab_size=8000, **model)
    from nmt_cli.config import config_to_dict

    (d / "checkpoints" / "config.json").write_text(
        json.dumps({"model": config_to_dict(cfg), "train": {"label_smoothing": label_smoothing}})
    )
    (d / "train.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"event": "train", "update": 10, "loss": 5.0},
                {"event": "valid", "update": 12, "valid_ppl": ppl + 1},
                {"event": "valid", "update": 14, "valid_ppl": ppl},
            )
        )
        + "\n"
    )
    (d / "score.json").write_text(json.dumps({"metric": "sacrebleu", "score": bleu}) + "\n")


def test_table_in_the_papers_layout(tmp_path):
    fake_row(tmp_path, "base", {}, 0.1, 9.5, 12.34)
    fake_row(tmp_path, "B:dk16", {"attention_key_dim": 16}, 0.1, 10.25, 11.0)
    fake_row(tmp_path, "E:learned", {"learned_pos": True}, 0.1, 9.0, 13.0)
    lines = load_table_module().table(tmp_path, ["base", "B:dk16", "E:learned"], 2).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[:5]]
    assert cells[0] == [
        "row",
        "N",
        "d_model",
        "d_ff",
        "h",
        "d_k",
        "d_v",
        "P_drop",
        "eps_ls",
        "pos",
        "updates",
        "PPL (dev)",
        "BLEU (dev)",
        "params x10^6",
    ]
    assert cells[2] == [
        "base",
        "3",
        "256",
        "1024",
        "4",
        "64",
        "64",
        "0.1",
        "0.1",
        "sinusoid",
        "14",
        "9.50",
        "12.3",
        "7.6",
    ]
    with torch.device("meta"):
        b_params = count_parameters(
            build_model(model_config("transformer_small", vocab_size=8000, attention_key_dim=16))
        )
    assert cells[3] == ["B:dk16", "", "", "", "", "16", "", "", "", "", "14", "10.25", "11.0", f"{b_params / 1e6:.1f}"]
    assert cells[4][9] == "learned" and cells[4][1:9] == [""] * 8
    assert "2 min of training" in lines[-1]


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "multi30k" / "train.en").exists(), reason=f"needs {SHARED_DATA}/multi30k")
def test_quick_recipe_end_to_end(tmp_path):
    run = subprocess.run(
        ["bash", str(RECIPE / "run.sh")],
        env=recipe_env(WORK_DIR=str(tmp_path / "work"), QUICK="1"),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith(("| base", "| B:dk16"))]
    assert len(rows) == 2
    for row in rows:
        ppl, bleu, params = (float(c) for c in row.strip("|").split("|")[-3:])
        assert ppl > 1 and 0 <= bleu <= 100 and params > 1
    assert run.stdout.strip().endswith((tmp_path / "work" / "table.md").read_text().strip())  # after preprocess's JSON
