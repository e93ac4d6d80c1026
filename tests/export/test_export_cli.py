"""`nmt export` on the command line: its output and its one-line errors."""

from __future__ import annotations

import hashlib
import shutil
import sys

import pytest
import torch
from click.testing import CliRunner

from nmt_cli.cli import cli

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def run(*args):
    return CliRunner().invoke(cli, ["--no-progress", "export", *args])


def test_missing_ctranslate2_is_one_line_with_install_hint(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 now raises ImportError
    monkeypatch.delitem(sys.modules, "nmt_cli.export.to_ctranslate2", raising=False)
    result = run("--path", str(tiny_checkpoint), "--output", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert "pip install" in result.output and "nmt[export]" in result.output
    assert "Traceback" not in result.output


def test_existing_output_needs_force(tiny_checkpoint, tmp_path):
    (tmp_path / "out").mkdir()
    result = run("--path", str(tiny_checkpoint), "--output", str(tmp_path / "out"))
    assert result.exit_code == 1 and "--force" in result.output


def test_parameter_without_a_place_is_one_line_error(tiny_checkpoint, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install nmt[export])")
    from nmt_cli.export import to_ctranslate2

    real = to_ctranslate2.Weights.__init__

    def with_extra(self, model):  # a model variant with a tensor CTranslate2's Transformer has no place for
        real(self, model)
        self.tensors["encoder.0.res_attn.gate"] = torch.ones(4).numpy()

    monkeypatch.setattr(to_ctranslate2.Weights, "__init__", with_extra)
    result = run("--path", str(tiny_checkpoint), "--output", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert "encoder.0.res_attn.gate" in result.output and len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither out nor its temporary


def test_force_replaces_only_an_earlier_export(tiny_checkpoint, tmp_path, monkeypatch):
    """--force once deleted whatever --output held: `--output ckpt --force` took the checkpoints with it."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install nmt[export])")
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent, run_dir)
    before = sorted(p.name for p in run_dir.iterdir())
    result = run("--path", str(run_dir / "checkpoint_last.pt"), "--output", str(run_dir), "--force")
    assert result.exit_code == 1 and "is not a CTranslate2 model directory" in result.output
    assert sorted(p.name for p in run_dir.iterdir()) == before
    (tmp_path / "file").write_text("x")
    result = run("--path", str(tiny_checkpoint), "--output", str(tmp_path / "file"), "--force")
    assert result.exit_code == 1 and "is a file" in result.output

    out = tmp_path / "ct2"
    assert run("--path", str(tiny_checkpoint), "--output", str(out)).exit_code == 0
    assert run("--path", str(tiny_checkpoint), "--output", str(out), "--force", "--quantization", "int8").exit_code == 0
    model = hashlib.sha256((out / "model.bin").read_bytes()).hexdigest()
    from nmt_cli.export import to_ctranslate2

    def failing(self, model):
        raise to_ctranslate2.ExportError("no place for a tensor")

    monkeypatch.setattr(to_ctranslate2.Weights, "__init__", failing)
    result = run("--path", str(tiny_checkpoint), "--output", str(out), "--force")
    assert result.exit_code == 1 and "no place for a tensor" in result.output
    assert hashlib.sha256((out / "model.bin").read_bytes()).hexdigest() == model  # the earlier export is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "file", "run"]  # no temporary left


def test_force_through_dot_or_a_link_replaces_the_export_it_names(tiny_checkpoint, tmp_path, monkeypatch):
    """`--output . --force` from inside an earlier export removed it and then failed on rmdir('.') (a traceback,
    no export left); a symbolic link to an export was a traceback too."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install nmt[export])")
    out = tmp_path / "ct2"
    assert run("--path", str(tiny_checkpoint), "--output", str(out)).exit_code == 0
    (tmp_path / "link").symlink_to(out)
    result = run("--path", str(tiny_checkpoint), "--output", str(tmp_path / "link"), "--force")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "link").is_symlink() and (out / "model.bin").is_file()
    float32_size = (out / "model.bin").stat().st_size
    monkeypatch.chdir(out)
    result = run("--path", str(tiny_checkpoint), "--output", ".", "--force", "--quantization", "int8")
    assert result.exit_code == 0, result.output
    assert (out / "model.bin").stat().st_size < float32_size  # the int8 export replaced the float32 one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "link"]  # nothing left beside


@pytest.mark.parametrize("normalize_before", [False, True])
def test_export_cli_writes_a_loadable_model(toy_data_bin, tmp_path, normalize_before):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install nmt[export])")
    from conftest import tiny_train_config

    from nmt_cli.commands.train import train
    from nmt_cli.config import SearchConfig, model_config

    train(
        tiny_train_config(toy_data_bin, tmp_path / "ck", max_update=1),
        model_config("transformer_tiny", normalize_before=normalize_before),
        SearchConfig(),
    )
    result = run(
        "--path",
        str(tmp_path / "ck" / "checkpoint_last.pt"),
        "--output",
        str(tmp_path / "ct2"),
        "--quantization",
        "int8",
    )
    assert result.exit_code == 0, result.output
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    assert translator.translate_batch([["▁1", "▁2"]], beam_size=2, max_decoding_length=5)[0].hypotheses


def test_a_key_size_ctranslate2_cannot_hold_is_refused(toy_data_bin, tmp_path):
    """Table 3 row B's key size (--attention-key-dim) exported fine and then broke CTranslate2's translate_batch
    ("new shape size (840) is incompatible with current size (896)")."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install nmt[export])")
    from conftest import tiny_train_config

    from nmt_cli.commands.train import train
    from nmt_cli.config import SearchConfig, model_config

    train(
        tiny_train_config(toy_data_bin, tmp_path / "ck", max_update=1),
        model_config("transformer_tiny", attention_key_dim=8),  # d_model 32, 2 heads: 16 per head otherwise
        SearchConfig(),
    )
    result = run("--path", str(tmp_path / "ck" / "checkpoint_last.pt"), "--output", str(tmp_path / "ct2"))
    assert result.exit_code == 1 and "attention_key_dim=8 (Table 3 row B)" in result.output
    assert not (tmp_path / "ct2").exists()
