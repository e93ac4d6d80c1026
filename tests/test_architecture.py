"""Module boundaries (../shared/STYLE.md): only the cli package imports click, only log.py imports rich,
data never imports model, and no two modules import each other (directly or through others)."""

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt_cli.cli import cli

PACKAGE = Path(__file__).resolve().parents[1] / "nmt_cli"
MODULES = sorted(PACKAGE.rglob("*.py"))


def imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_import_boundaries(path):
    names = set(imports(path))
    rel = path.relative_to(PACKAGE).as_posix()
    if not rel.startswith("cli/") and rel != "__main__.py":
        assert not any(n == "click" or n.startswith("click.") or n.startswith("nmt_cli.cli") for n in names)
    if rel != "log.py":
        assert not any(n == "rich" or n.startswith("rich.") for n in names)
    if rel.startswith("data/"):
        assert not any(n.startswith(("nmt_cli.model", "nmt_cli.train", "nmt_cli.search")) for n in names)


def test_no_import_cycles():
    """Imports go one way: the graph of nmt_cli modules (imports inside functions included) has no cycle."""
    known = {module_name(p) for p in MODULES}
    graph = {module_name(p): {n for n in imports(p) if n in known and n != module_name(p)} for p in MODULES}
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


@pytest.mark.parametrize(
    "command", [[], ["preprocess"], ["train"], ["average-checkpoints"], ["generate"], ["score"], ["serve"]]
)
def test_help_works_and_shows_defaults(command):
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    if command and command[0] in ("preprocess", "train", "generate", "serve"):
        assert "[default:" in result.output


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and "nmt, version" in result.output
