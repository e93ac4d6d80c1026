"""A few treebank trees written as a split and preprocessed: the parsing tests' and the serve tests' data."""

from pathlib import Path

from click.testing import CliRunner

from nmt_cli.cli import cli

TREES = [
    "((S (NP-SBJ (DT The) (NN cat)) (VP (VBZ sits) (PP-LOC (IN on) (NP (DT the) (NN mat)))) (. .)))",
    "((S (NP-SBJ (PRP It)) (VP (VBD ran) (ADVP (RB away))) (. .)))",
    "((S (NP-SBJ-1 (-NONE- *)) (NP (NNS Dogs)) (VP (VBP bark)) (. .)))",
    "((FRAG (NP (DT A) (JJ big) (NN dog)) (. .)))",
]


def write_split(prefix: Path, n: int, words: bool = True) -> None:
    trees = [TREES[i % len(TREES)] for i in range(n)]
    Path(f"{prefix}.tree").write_text("\n".join(trees) + "\n")
    if words:
        from nmt_cli.parsing.tree import clean, parse_tree

        Path(f"{prefix}.words").write_text("\n".join(" ".join(clean(parse_tree(t)).words()) for t in trees) + "\n")


def preprocess(tmp_path, *extra):
    return CliRunner().invoke(
        cli,
        [
            "preprocess",
            "-s",
            "words",
            "-t",
            "tree",
            "--target-format",
            "ptb-tree",
            "--trainpref",
            str(tmp_path / "train"),
            "--destdir",
            str(tmp_path / "bin"),
            "--vocab-size",
            "60",
            *extra,
        ],
    )
