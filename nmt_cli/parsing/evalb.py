"""Bracket scoring as EVALB does it (Sekine and Collins, 1997), with its COLLINS.prm settings by default: per sentence,
a preterminal with a delete label is removed with its word, other preterminals give the words and tags, every other
bracket is a constituent over the words it spans (dropped when it spans none or has a delete label; function tags
cut; ADVP = PRT), matched one to one by span and label. A sentence whose test tree has no words is skipped, one
whose words differ from the gold's is an error; both count only in "Number of ... sentence", as in EVALB.

Two deliberate differences: the treebank's unlabelled outer bracket is read as TOP (deleted), and scoring never
stops after MAX_ERROR errors (EVALB exits); error sentences are listed instead."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli.errors import DataError
from nmt_cli.parsing.tree import TOKEN

logger = logging.getLogger(__name__)

OK, ERROR, SKIP = 0, 1, 2


@dataclass(frozen=True)
class EvalbParams:
    """The settings of an EVALB .prm file."""

    labeled: bool = True
    delete_labels: frozenset[str] = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
    delete_labels_for_length: frozenset[str] = frozenset({"-NONE-"})
    eq_labels: tuple[tuple[str, str], ...] = (("ADVP", "PRT"),)
    eq_words: tuple[tuple[str, str], ...] = ()
    cutoff_len: int = 40

    def label_eq(self, a: str, b: str) -> bool:
        return a == b or (a, b) in self.eq_labels or (b, a) in self.eq_labels

    def word_eq(self, a: str, b: str) -> bool:
        return a == b or (a, b) in self.eq_words or (b, a) in self.eq_words


COLLINS = EvalbParams()


@dataclass
class Reading:
    """One tree as EVALB sees it."""

    terminals: list[tuple[str, str]]  # (word, tag) of the kept words
    brackets: list[tuple[int, int, str]]  # (start, end, label) of every non-preterminal bracket
    length: int  # words not tagged with a DELETE_LABEL_FOR_LENGTH label
    problem: str | None = None  # a reading error (EVALB's "Error" while reading)


def read_evalb(text: str, params: EvalbParams) -> Reading:
    """Read a line the way EVALB's read_line does."""
    tokens = TOKEN.findall(text)
    terminals: list[tuple[str, str]] = []
    brackets: list[tuple[int, int, str]] = []
    stack: list[int] = []
    length, problem, i, first = 0, None, 0, True
    while i < len(tokens):
        tok = tokens[i]
        if tok == "(":
            label = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] not in ("(", ")") else ""
            i += 2 if label else 1
            if label and i + 1 < len(tokens) and tokens[i] not in ("(", ")") and tokens[i + 1] == ")":
                if label not in params.delete_labels_for_length:
                    length += 1
                if label not in params.delete_labels:
                    terminals.append((tokens[i], label))
                i += 2
                continue
            if label and i < len(tokens) and tokens[i] not in ("(", ")"):
                problem = problem or "more than two elements in a bracket"
                i += 1
            stack.append(len(brackets))
            brackets.append((len(terminals), -1, label or ("TOP" if first else "")))
        elif tok == ")":
            if not stack:
                problem = problem or "unbalanced brackets (too many close brackets)"
            else:
                b = stack.pop()
                brackets[b] = (brackets[b][0], len(terminals), brackets[b][2])
            i += 1
        else:
            problem = problem or f"word {tok!r} outside a bracket"
            i += 1
        first = False
    if stack:
        problem = problem or "unbalanced brackets (too many open brackets)"
        for b in stack:
            brackets[b] = (brackets[b][0], len(terminals), brackets[b][2])
    return Reading(terminals, brackets, length, problem)


def modify_label(label: str) -> str:
    """EVALB cuts a label at its first '-' or '=' (NP-SBJ-1 -> NP)."""
    return re.split(r"[-=]", label, maxsplit=1)[0]


def kept_brackets(reading: Reading, params: EvalbParams) -> list[tuple[int, int, str]]:
    out = []
    for start, end, label in reading.brackets:
        label = modify_label(label)
        if start == end or any(params.label_eq(label, d) for d in params.delete_labels):
            continue
        out.append((start, end, label))
    return out


@dataclass
class SentenceResult:
    line: int
    length: int
    status: int
    match: int = 0
    gold: int = 0
    test: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0
    message: str = ""

    def row(self) -> str:
        """One line of EVALB's table."""
        recall = 100.0 * self.match / self.gold if self.gold else 0.0
        precision = 100.0 * self.match / self.test if self.test else 0.0
        tag_acc = 100.0 * self.correct_tags / self.words if self.words and self.status == OK else 0.0
        row = (
            f"{self.line:4d}  {self.length:3d}    {self.status}  {recall:6.2f} {precision:6.2f}   {self.match:3d}"
            f"    {self.gold:3d}  {self.test:3d}    {self.crossing:3d}   {self.words:4d}  "
            f"{self.correct_tags:4d}   {tag_acc:6.2f}"
        )
        return row + (f"    {self.message}" if self.message else "")


def score_sentence(line: int, gold_text: str, test_text: str, params: EvalbParams) -> SentenceResult:
    """EVALB's calc_result for one pair of lines."""
    gold, test = read_evalb(gold_text, params), read_evalb(test_text, params)
    result = SentenceResult(line, gold.length, OK, words=len(gold.terminals))
    if not test.terminals:
        result.status, result.message = SKIP, "no words in the test tree"
        return result
    problem = gold.problem and f"gold: {gold.problem}" or test.problem and f"test: {test.problem}"
    if not problem and len(gold.terminals) != len(test.terminals):
        problem = f"length unmatch ({len(gold.terminals)}|{len(test.terminals)})"
    if not problem:
        for (gw, _), (tw, _) in zip(gold.terminals, test.terminals):
            if not params.word_eq(gw, tw):
                problem = f"words unmatch ({gw}|{tw})"
                break
    if problem:
        result.status, result.message = ERROR, problem
        return result
    g, t = kept_brackets(gold, params), kept_brackets(test, params)
    used = [False] * len(t)
    for gs, ge, gl in g:
        for j, (ts, te, tl) in enumerate(t):
            if not used[j] and (gs, ge) == (ts, te) and (not params.labeled or params.label_eq(gl, tl)):
                used[j] = True
                result.match += 1
                break
    result.crossing = sum(any((gs < ts < ge < te) or (ts < gs < te < ge) for gs, ge, _ in g) for ts, te, _ in t)
    result.gold, result.test = len(g), len(t)
    result.correct_tags = sum(params.label_eq(gt, tt) for (_, gt), (_, tt) in zip(gold.terminals, test.terminals))
    return result


@dataclass
class Totals:
    """The summary of EVALB over a set of sentences."""

    sentences: int = 0
    errors: int = 0
    skipped: int = 0
    match: int = 0
    gold: int = 0
    test: int = 0
    complete: int = 0
    crossing: int = 0
    no_crossing: int = 0
    two_or_less: int = 0
    words: int = 0
    correct_tags: int = 0

    def add(self, r: SentenceResult) -> None:
        self.sentences += 1
        if r.status != OK:
            self.errors += r.status == ERROR
            self.skipped += r.status == SKIP
            return
        self.match, self.gold, self.test = self.match + r.match, self.gold + r.gold, self.test + r.test
        self.complete += r.match == r.gold == r.test
        self.crossing += r.crossing
        self.no_crossing += r.crossing == 0
        self.two_or_less += r.crossing <= 2
        self.words += r.words
        self.correct_tags += r.correct_tags

    @property
    def valid(self) -> int:
        return self.sentences - self.errors - self.skipped

    @property
    def recall(self) -> float:
        return 100.0 * self.match / self.gold if self.gold else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.match / self.test if self.test else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def summary(self) -> dict[str, float]:
        v = self.valid
        return {
            "sentences": self.sentences,
            "error_sentences": self.errors,
            "skip_sentences": self.skipped,
            "valid_sentences": v,
            "recall": self.recall,
            "precision": self.precision,
            "f1": self.f1,
            "complete_match": 100.0 * self.complete / v if v else 0.0,
            "average_crossing": self.crossing / v if v else 0.0,
            "no_crossing": 100.0 * self.no_crossing / v if v else 0.0,
            "two_or_less_crossing": 100.0 * self.two_or_less / v if v else 0.0,
            "tagging_accuracy": 100.0 * self.correct_tags / self.words if self.words else 0.0,
        }


@dataclass
class EvalbResult:
    sentences: list[SentenceResult]
    all: Totals = field(default_factory=Totals)
    short: Totals = field(default_factory=Totals)  # sentences of length <= cutoff_len


def evalb(gold_lines: Sequence[str], test_lines: Sequence[str], params: EvalbParams = COLLINS) -> EvalbResult:
    """Score test trees against gold trees, line by line."""
    result = EvalbResult([score_sentence(i, g, t, params) for i, (g, t) in enumerate(zip(gold_lines, test_lines), 1)])
    for r in result.sentences:
        result.all.add(r)
        if r.length <= params.cutoff_len:
            result.short.add(r)
    return result


_SUMMARY_NAMES = [
    ("sentences", "Number of sentence"),
    ("error_sentences", "Number of Error sentence"),
    ("skip_sentences", "Number of Skip  sentence"),
    ("valid_sentences", "Number of Valid sentence"),
    ("recall", "Bracketing Recall"),
    ("precision", "Bracketing Precision"),
    ("f1", "Bracketing FMeasure"),
    ("complete_match", "Complete match"),
    ("average_crossing", "Average crossing"),
    ("no_crossing", "No crossing"),
    ("two_or_less_crossing", "2 or less crossing"),
    ("tagging_accuracy", "Tagging accuracy"),
]


def format_report(result: EvalbResult, params: EvalbParams, verbose: bool) -> str:
    """EVALB's output: the per-sentence table when verbose, then the summary for all and for short sentences."""
    lines = []
    if verbose:
        lines += [
            "  Sent.                        Matched  Bracket   Cross        Correct Tag",
            " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy",
            "=" * 76,
            *(r.row() for r in result.sentences),
            "=" * 76,
        ]
    lines.append("=== Summary ===")
    for title, totals in (("All", result.all), (f"len<={params.cutoff_len}", result.short)):
        lines += ["", f"-- {title} --"]
        for key, name in _SUMMARY_NAMES:
            value = totals.summary()[key]
            lines.append(f"{name:<26}= {value:6d}" if isinstance(value, int) else f"{name:<26}= {value:6.2f}")
    return "\n".join(lines)


def report_json(result: EvalbResult, params: EvalbParams, verbose: bool) -> dict[str, Any]:
    """format_report's numbers for machines: all sentences, those up to cutoff_len, and (verbose) each one."""
    report: dict[str, Any] = {
        "metric": "bracket-f1",
        **result.all.summary(),
        f"len<={params.cutoff_len}": result.short.summary(),
    }
    if verbose:
        report["per_sentence"] = [asdict(r) for r in result.sentences]
    return report


def score_tree_files(sys_path: Path, ref_path: Path, params: EvalbParams = COLLINS) -> EvalbResult:
    """EVALB over two files of one tree per line; DataError for unequal lengths or non-tree input."""
    from nmt_cli.metrics import read_text

    test, gold = read_text(sys_path), read_text(ref_path)
    if not gold:
        raise DataError(f"{ref_path} is empty; there is nothing to score")
    if len(test) != len(gold):
        raise DataError(
            f"{sys_path} has {len(test)} lines but {ref_path} has {len(gold)}; "
            "bracket-f1 needs one tree per line in both"
        )
    for path, lines in ((ref_path, gold), (sys_path, test)):
        for n, line in enumerate(lines, start=1):
            if line.strip() and not line.lstrip().startswith("("):
                raise DataError(
                    f"{path}:{n}: not a bracketed tree ({line[:40]!r}); --metric bracket-f1 "
                    "scores parser output (`nmt generate` with a parsing checkpoint) against "
                    "gold trees; use sacrebleu for translations"
                )
    result = evalb(gold, test, params)
    errors = [r for r in result.sentences if r.status == ERROR]
    if not result.all.valid:  # EVALB would print zeros: no score at all, not a score of 0
        example = f"; line {errors[0].line}: {errors[0].message}" if errors else ""
        raise DataError(
            f"no sentence of {sys_path} could be scored against {ref_path}: {result.all.errors} error and "
            f"{result.all.skipped} skipped (empty) sentence(s){example}"
        )
    if errors:  # EVALB prints these on stderr too; they are left out of every number but the error count
        logger.warning(
            "%d error sentence(s) left out of the scores, e.g. line %d: %s (--verbose lists them)",
            len(errors),
            errors[0].line,
            errors[0].message,
        )
    return result
