"""Module boundaries (CONTRIBUTING.md "Where things live"): packages sit in layers and import only downwards
(imports inside functions included), the same-layer imports allowed are listed with their reason, only the cli
package imports click, only log.py imports rich, no two modules import each other, the model's text names no
module of the search or the server that call it, and no module passes MAX_LINES unless LONG_MODULES says why."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt_cli.cli import cli

PACKAGE = Path(__file__).resolve().parents[1] / "nmt_cli"
MODULES = sorted(PACKAGE.rglob("*.py"))

# Each top-level module or subpackage of nmt_cli and its layer, bottom to top. A package imports from lower layers;
# from its own layer only along an edge of SAME_LAYER. "nmt_cli" is the package's __init__ (the version).
LAYERS = {
    "nmt_cli": 0,
    "errors": 1,
    "log": 1,
    "files": 1,
    "signals": 1,
    "allocator": 1,
    "steps": 1,
    "flags": 2,
    "config": 2,
    "runtime": 2,
    "data": 3,
    "model": 4,
    "checkpoint": 5,
    "metrics": 5,
    "search": 6,
    "train": 6,
    "parsing": 6,
    "export": 6,
    "plot": 6,
    "serve": 6,
    "commands": 7,
    "cli": 8,
    "__main__": 9,
}
SAME_LAYER = {
    ("files", "errors"): "a file that cannot be read or written is the user's error (errors.py)",
    ("files", "signals"): "a signal stops a write cleanly, its temporary removed (signals.py)",
    ("config", "flags"): "every config field is a flag: its metadata and bounds come from flags.py",
    ("parsing", "search"): "parsing plugs its tree constraint into the search",
    ("train", "search"): "validation translates the valid split with the search driver to score BLEU",
    ("serve", "search"): "serve translates with generate's search driver and settings",
    ("serve", "parsing"): "serve parses with a parsing checkpoint, as generate does",
    ("plot", "search"): "plot attention draws the model's own greedy translation",
    ("plot", "parsing"): "plot attention reads a parser's sentence as the treebank writes it",
}

# A module a newcomer reads in one sitting; a longer one is split, or listed here with the reason it stays whole.
MAX_LINES = 400
LONG_MODULES: dict[str, str] = {}


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


def package_of(module):
    """The layer unit of an nmt_cli module name: `nmt_cli.search.beam` -> "search", `nmt_cli` -> "nmt_cli"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_imports():
    """{(importer, imported): first module:line that makes the edge}, over every import in every module."""
    edges = {}
    for path in MODULES:
        here = package_of(module_name(path))
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                there = package_of(name)
                if name.split(".")[0] == "nmt_cli" and there != here:
                    edges.setdefault((here, there), f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return edges


def test_every_package_has_a_layer():
    packages = {package_of(module_name(p)) for p in MODULES}
    assert not packages - LAYERS.keys(), "give each new package its layer in LAYERS (and CONTRIBUTING.md)"
    assert not LAYERS.keys() - packages, "a package of LAYERS is gone: drop it there (and from CONTRIBUTING.md)"


def test_imports_go_down_the_layers():
    """No upward import and no same-layer import outside SAME_LAYER, at module level or inside a function."""
    wrong = [
        f"{where}: {here} (layer {LAYERS[here]}) imports {there} (layer {LAYERS[there]})"
        for (here, there), where in sorted(package_imports().items())
        if LAYERS[there] > LAYERS[here] or (LAYERS[there] == LAYERS[here] and (here, there) not in SAME_LAYER)
    ]
    assert not wrong, "\n".join(wrong)


def test_same_layer_edges_are_used_and_acyclic():
    """Every allowed same-layer edge is still needed (else drop it) and they make no package cycle."""
    edges = package_imports()
    assert not [edge for edge in SAME_LAYER if edge not in edges]
    assert not [(a, b) for (a, b) in SAME_LAYER if (b, a) in SAME_LAYER]
    assert all(LAYERS[a] == LAYERS[b] for a, b in SAME_LAYER)


def test_no_package_cycle():
    """The packages' import graph, imports inside functions included, has no cycle (what the layers imply)."""
    graph = {}
    for here, there in package_imports():
        graph.setdefault(here, set()).add(there)
    assert find_cycle(graph) is None, "package import cycle: " + " -> ".join(find_cycle(graph) or [])


def find_cycle(graph):
    """A cycle of `graph` ({node: successors}) as a list of nodes, first repeated last; None when there is none."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt, stack + [nxt])):
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


# Packages whose modules the model's own text must not name either: the model serves every search and the
# server through decode_step and its cache, and a hook kept for one of them (a per-row position, a bias for
# rows that joined late) belongs to that caller, not to the model's core. Imports are LAYERS' to check.
UNNAMED_BELOW = {"model": ("search", "serve")}


def named_modules(source, packages):
    """The modules of `packages` that comments and strings (docstrings included) in `source` name, as
    `search/pool.py`, `serve/` or `nmt_cli.search.pool`."""
    pattern = re.compile(rf"(?<![\w.])(?:nmt_cli[./])?(?:{'|'.join(packages)})(?:/[\w.]*|\.\w+)")
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    texts = [t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING)]
    return [m.group(0) for text in texts for m in pattern.finditer(text)]


def test_named_modules_finds_comments_and_docstrings():
    source = '"""Rows that joined late (search/pool.py)."""\nx = 1  # see nmt_cli.serve.batcher\ny = "a research/ b"\n'
    assert named_modules(source, ("search", "serve")) == ["search/pool.py", "nmt_cli.serve.batcher"]


@pytest.mark.parametrize("package", sorted(UNNAMED_BELOW))
def test_lower_layers_do_not_name_the_modules_that_use_them(package):
    named = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for name in named_modules(path.read_text(), UNNAMED_BELOW[package])
    ]
    assert not named, "\n".join(named)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_import_boundaries(path):
    names = set(imports(path))
    rel = path.relative_to(PACKAGE).as_posix()
    if not rel.startswith("cli/") and rel != "__main__.py":
        assert not any(n == "click" or n.startswith("click.") or n.startswith("nmt_cli.cli") for n in names)
    if rel != "log.py":
        assert not any(n == "rich" or n.startswith("rich.") for n in names)


def test_the_task_is_asked_in_one_place():
    """`target_format == "ptb-tree"` is written in config.parses_trees (and parsing/); other modules ask it."""
    compares = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in MODULES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare)
        and any(isinstance(c, ast.Constant) and c.value == "ptb-tree" for c in [node.left, *node.comparators])
    ]
    outside = [c for c in compares if not c.startswith(("nmt_cli/config/__init__.py:", "nmt_cli/parsing/"))]
    assert not outside and compares, compares


def test_train_counters_move_only_through_train_state():
    """The update count and the epoch cursor are TrainState's to advance (advance_update, next_epoch, ...)."""
    counters = {"update", "epoch", "batch_in_epoch", "lr_start"}
    assigned = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in MODULES
        if path.relative_to(PACKAGE).as_posix() != "train/state.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Assign, ast.AugAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for part in (target.elts if isinstance(target, ast.Tuple) else [target])
        if isinstance(part, ast.Attribute) and part.attr in counters
    ]
    assert not assigned, assigned


def test_no_import_cycles():
    """Imports go one way: the graph of nmt_cli modules (imports inside functions included) has no cycle."""
    known = {module_name(p) for p in MODULES}
    graph = {module_name(p): {n for n in imports(p) if n in known and n != module_name(p)} for p in MODULES}
    assert find_cycle(graph) is None, "import cycle: " + " -> ".join(find_cycle(graph) or [])


@pytest.mark.parametrize(
    "command", [[], ["preprocess"], ["train"], ["average-checkpoints"], ["generate"], ["score"], ["serve"]]
)
def test_help_works_and_shows_defaults(command):
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    if command and command[0] in ("preprocess", "train", "generate", "serve"):
        assert "default: " in result.output  # "[default: X]", or "[env var: NMT_...; default: X]"


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and "nmt, version" in result.output


def test_modules_stay_short_or_say_why():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in MODULES
        if (n := len(path.read_text().splitlines())) > MAX_LINES and str(path.relative_to(PACKAGE)) not in LONG_MODULES
    }
    assert not long, f"modules over {MAX_LINES} lines, to split or list in LONG_MODULES with a reason: {long}"
    assert all(reason for reason in LONG_MODULES.values())
