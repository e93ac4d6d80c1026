"""Every option of every command also from NMT_<COMMAND>_<OPTION> and from --config FILE (TOML), in the order
command line > environment > config file > default; a bad config file is one error: line naming it."""

import click
import pytest
from conftest import nmt

from nmt_cli.cli import cli

# ServeConfig refuses --max-request-sentences above --max-queue before any model is read, naming both values: the
# message shows which source set --max-queue.
TOO_MANY = ["serve", "--path", "model.pt", "--max-request-sentences", "10"]


def queue_said(result):
    assert result.exit_code == 1, result.output
    return result.output.split("exceeds --max-queue ")[1].split(":")[0]


def test_command_line_beats_environment_beats_config_file(tmp_path, monkeypatch):
    config = tmp_path / "serve.toml"
    config.write_text("max-queue = 5\n")
    assert queue_said(nmt(*TOO_MANY, "--config", config)) == "5"
    monkeypatch.setenv("NMT_SERVE_MAX_QUEUE", "7")
    assert queue_said(nmt(*TOO_MANY, "--config", config)) == "7"
    assert queue_said(nmt(*TOO_MANY, "--config", config, "--max-queue", "8")) == "8"
    monkeypatch.setenv("NMT_SERVE_CONFIG", str(config))  # --config itself from the environment
    monkeypatch.delenv("NMT_SERVE_MAX_QUEUE")
    assert queue_said(nmt(*TOO_MANY)) == "5"


def test_config_file_takes_every_kind_of_option(tmp_path):
    config = tmp_path / "serve.toml"
    config.write_text(
        'path = ["a=missing-a.pt", "b=missing-b.pt"]\nmax_queue = 4\ndevice = "cpu"\nfixed-slots = true\n'
    )
    result = nmt("serve", "--config", config, "--max-request-sentences", "4")
    assert result.exit_code == 1
    assert "missing-a.pt" in result.output  # --path from the file (a list for a repeatable option)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("max-queue = 5\nmax-qeue = 6\n", "'max-qeue' is no option of nmt serve"),
        ("[serve]\nmax-queue = 5\n", "'serve' is no option of nmt serve"),
        ("max-queue = \n", "is not a TOML file: Invalid value (at line 1, column 13)"),
    ],
)
def test_a_bad_config_file_is_one_error_line_naming_it(tmp_path, text, says):
    config = tmp_path / "serve.toml"
    config.write_text(text)
    result = nmt("serve", "--path", "model.pt", "--config", config)
    assert result.exit_code == 1
    assert result.output.splitlines() == [result.output.splitlines()[0]]
    assert result.output.startswith(f"error: --config {config}") and says in result.output


def leaf_commands(group, path=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


@pytest.mark.parametrize(
    ("path", "command"), list(leaf_commands(cli)), ids=lambda p: "-".join(p) if isinstance(p, tuple) else ""
)
def test_help_names_every_option_s_variable_and_config(path, command):
    text = "".join(nmt(*path, "--help").output.split())  # the help wraps long names anywhere
    assert "--configFILE" in text
    prefix = "_".join(["NMT", *path]).upper().replace("-", "_")
    for param in command.params:
        if isinstance(param, click.Option):
            assert f"[envvar:{prefix}_{param.name.upper()}" in text, param.name
