"""Module boundaries (../shared/STYLE.md): only cli.py imports click, only log.py imports rich, data never imports model."""

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt_cli.cli import cli

PACKAGE = Path(__file__).resolve().parents[1] / "nmt_cli"


def imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_import_boundaries(path):
    names = set(imports(path))
    rel = path.relative_to(PACKAGE).as_posix()
    if rel not in ("cli.py", "__main__.py"):
        assert not any(n == "click" or n.startswith("click.") or n == "nmt_cli.cli" for n in names)
    if rel != "log.py":
        assert not any(n == "rich" or n.startswith("rich.") for n in names)
    if rel.startswith("data/"):
        assert not any(n.startswith(("nmt_cli.model", "nmt_cli.train", "nmt_cli.search")) for n in names)


@pytest.mark.parametrize("command", [[], ["preprocess"], ["train"], ["average-checkpoints"], ["generate"], ["score"]])
def test_help_works_and_shows_defaults(command):
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    if command and command[0] in ("preprocess", "train", "generate"):
        assert "[default:" in result.output


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and "nmt, version" in result.output
