"""Bracketed Penn Treebank trees: parse one per line, print, and clean (function tags, -NONE-, empty nodes).

A tree is `(LABEL child ...)`; a preterminal is `(TAG word)`. The treebank's unlabelled outer bracket
`( (S ...) )` is read as the label "" and dropped by `clean` (or kept as TOP when it holds several trees).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nmt_cli.errors import DataError

TOKEN = re.compile(r"\(|\)|[^\s()]+")
EMPTY_TAG = "-NONE-"
MAX_DEPTH = 500  # nesting read from files (the treebank sample's deepest tree nests 30): clean and linearize recurse


class TreeSyntaxError(ValueError):
    """A line is not one well-formed bracketed tree (the reader adds file and line)."""


@dataclass
class Tree:
    label: str
    children: list[Tree] = field(default_factory=list)
    word: str | None = None  # set for preterminals (which then have no children)

    @property
    def is_preterminal(self) -> bool:
        return self.word is not None

    def preterminals(self) -> Iterator[Tree]:
        """Left to right; iterative, as __str__, so that any tree the search builds can be written."""
        stack = [self]
        while stack:
            node = stack.pop()
            if node.is_preterminal:
                yield node
            else:
                stack.extend(reversed(node.children))

    def words(self) -> list[str]:
        return [p.word for p in self.preterminals() if p.word is not None]

    def tags(self) -> list[str]:
        return [p.label for p in self.preterminals()]

    def __str__(self) -> str:
        parts: list[str] = []
        stack: list[Tree | str] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                parts.append(node)
            elif node.is_preterminal:
                parts.append(f" ({node.label} {node.word})")
            else:
                parts.append(f" ({node.label}")
                stack.append(")")
                stack.extend(reversed(node.children))
        return "".join(parts)[1:]


def parse_tree(text: str) -> Tree:
    """One bracketed tree; TreeSyntaxError says what is wrong (unbalanced, not a tree, empty)."""
    tokens = TOKEN.findall(text)
    if not tokens:
        raise TreeSyntaxError("empty line, expected a bracketed tree")
    if tokens[0] != "(":
        raise TreeSyntaxError(f"not a tree: starts with {tokens[0]!r} instead of '('")
    stack: list[Tree] = []
    root: Tree | None = None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if root is not None and tok == ")":
            raise TreeSyntaxError("unbalanced brackets: too many ')'")
        if root is not None:
            raise TreeSyntaxError(f"text after the end of the tree: {' '.join(tokens[i : i + 3])!r}")
        if tok == "(":
            label = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] not in "()" else ""
            if not label and stack:
                raise TreeSyntaxError(
                    "a bracket without a label inside the tree (only the outermost may have none; "
                    "a word '(' or ')' is written -LRB- or -RRB-)"
                )
            if len(stack) >= MAX_DEPTH:
                raise TreeSyntaxError(f"the tree nests deeper than {MAX_DEPTH} levels")
            i += 2 if label else 1
            if i + 1 < len(tokens) and tokens[i] not in "()" and tokens[i + 1] == ")":
                node = Tree(label, word=tokens[i])  # (TAG word)
                i += 2
                _attach(stack, node)
                root = node if not stack else None
                continue
            stack.append(Tree(label))
            continue
        if tok == ")":
            if not stack:
                raise TreeSyntaxError("unbalanced brackets: too many ')'")
            node = stack.pop()
            if not node.children:
                raise TreeSyntaxError(f"empty constituent ({node.label})")
            _attach(stack, node)
            root = node if not stack else None
            i += 1
            continue
        raise TreeSyntaxError(f"word {tok!r} outside a (TAG word) preterminal")
    if stack:
        raise TreeSyntaxError(f"unbalanced brackets: {len(stack)} '(' never closed")
    assert root is not None
    return root


def _attach(stack: list[Tree], node: Tree) -> None:
    if stack:
        stack[-1].children.append(node)


def strip_function_tag(label: str) -> str:
    """NP-SBJ-1 -> NP, NP=2 -> NP; labels that start with '-' (-NONE-, -LRB-) are kept."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0] or label


def clean(tree: Tree) -> Tree | None:
    """Drop -NONE- elements and the constituents left empty, strip function tags, drop the unlabelled
    outer bracket (TOP when it holds several trees). None if nothing is left."""

    def walk(node: Tree) -> Tree | None:
        if node.is_preterminal:
            return None if node.label == EMPTY_TAG else Tree(node.label, word=node.word)
        kids = []
        for child in node.children:  # a loop, not a comprehension: one frame per level (MAX_DEPTH)
            kid = walk(child)
            if kid is not None:
                kids.append(kid)
        return Tree(strip_function_tag(node.label), kids) if kids else None

    out = walk(tree)
    if out is not None and out.label == "":
        out = out.children[0] if len(out.children) == 1 else Tree("TOP", out.children)
    return out


def read_trees(path: Path) -> list[Tree]:
    """One tree per line; DataError names the file and line of the first bad one."""
    if not path.is_file():
        raise DataError(f"tree file {path} does not exist")
    trees = []
    with path.open(encoding="utf-8", newline="\n") as f:  # lines end at "\n" only, as in data.split_lines
        for n, line in enumerate(f, start=1):
            try:
                trees.append(parse_tree(line))
            except TreeSyntaxError as e:
                raise DataError(f"{path}:{n}: {e}") from None
            except UnicodeDecodeError:
                raise DataError(f"{path}:{n}: invalid UTF-8") from None
    return trees
