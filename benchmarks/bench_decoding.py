"""What each decoding feature of issue 49 costs against plain beam-4 search, on the same sentences, in one run.

`nmt generate --beam 4` on --sentences sentences (500 of test_2016_flickr.en by default) is the baseline; each
feature is the same command with one thing added: an ensemble of two checkpoints (`--path CKPT:CKPT2`), two
lexical constraints per sentence (`--constraints-file`: the two longest words of the baseline's own translation of
that sentence, so every constraint can be met), a target prefix (`--prefix-file`: the first word of the baseline's
translation), `--no-repeat-ngram-size 3`, and `--print-alignment hard` (jsonl output, which holds the alignment).
Scoring is `nmt score-pairs` of the baseline's own translations, compared in sentences per second. The runs
alternate, round after round (--rounds), and each figure is the median over the rounds of the command's own logged
translation (or scoring) time, without start-up and loading. A feature this checkout's `nmt` does not have (its
option is not in `nmt generate --help`, or `score-pairs` not in `nmt --help`) is reported as not available, one
whose run fails as failed (and the exit status is 1). The check column says what the first round's output shows:
how many outputs hold their constraints, begin with their prefix, and (the ensemble) equal the baseline's.

On a GPU 500 sentences are a short run (the H200 on 2026-11-27: 1.1 s of search, 0.36 s of scoring, 3.2x), and
the process's first CUDA calls (library set-up, kernels loaded on first use) fall inside it. `--repeat K` has each
command read the sentences K times over, so that the rates are nearer the steady ones, and on CUDA an untimed
baseline run comes first, so that no timed run pays for kernels compiled and cached on first use. Each process
still pays its own start on the device (libraries set up, kernels loaded on first use) inside its timed run, which
weighs on a run the more the shorter it is: `--score-repeat M` has score-pairs read the baseline's pairs M times
over again, so that its run lasts about as long as the search's (the rates are per sentence, so the comparison
stands).

Issue 49's targets: an ensemble of 2 at most 2.2x the baseline's time, 2 constraints per sentence at most 3x,
scoring at least 10x the baseline's sentences per second.
    .venv/bin/python benchmarks/bench_decoding.py --path work/multi30k_en_de/average.pt --threads 2
    .venv/bin/python benchmarks/bench_decoding.py --tiny --path CKPT   # a few sentences: does it all run
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from common import MULTI30K, NMT, WORK, machine, report, run

TINY_SENTENCES = ["1 2 3", "4 5 6 7 8", "9 0", "3 3 1 4", "2 7 1 8 2 8", "5", "6 6 6", "8 1 9 0 2"]
TRANSLATED = re.compile(r"translated (\d+) sentences \(\d+ tokens\) in [\d.]+ s: ([\d.]+) sentences/s")
SCORED = re.compile(r"scored (\d+) pairs .*?: ([\d.]+) pairs/s")


@dataclass
class Feature:
    """One row of the table: the option that shows `nmt` has it, and how its run differs from the baseline's."""

    name: str
    option: str  # looked for in `nmt generate --help` (`nmt --help` for a subcommand)
    target: str  # issue 49's bound, as printed
    limit: float | None = None  # the bound on x baseline (time; for scoring, sentences/s)
    sentences: int = 0  # what its runs read, where not the baseline's sentences (score-pairs with --score-repeat)
    seconds: list[float] = field(default_factory=list)
    available: bool = True
    error: str | None = None  # why its run failed
    check: str = ""  # what its first run's output was checked for


def help_text(*command: str) -> str:
    return subprocess.run(NMT + [*command, "--help"], capture_output=True, text=True, check=True).stdout


def logged_seconds(stderr: str, pattern: re.Pattern[str]) -> float:
    """The command's own time from its closing log line (sentences over sentences/s: the seconds themselves are
    printed to 0.1 s, 0.0 for a tiny input)."""
    found = pattern.search(stderr)
    if found is None:
        raise SystemExit(f"no timing line in the log:\n{stderr[-2000:]}")
    return int(found.group(1)) / float(found.group(2))


def generate(args: argparse.Namespace, src: Path, out: Path, extra: list[str]) -> float:
    """`nmt generate --beam B` of `src` into `out`, with `extra` options (--path among them): its logged translation
    seconds."""
    command = NMT + ["generate", "--input", str(src), "--device", args.device]
    command += ["--threads", str(args.threads), "--beam", str(args.beam), *extra]
    with out.open("w") as stdout:
        stderr, _, _ = run(command, stdout=stdout)
    return logged_seconds(stderr, TRANSLATED)


def score_pairs(args: argparse.Namespace, src: Path, hyp: Path, out: Path) -> float:
    """`nmt score-pairs` of (src, hyp) into `out`: its logged scoring seconds."""
    command = NMT + ["score-pairs", "--path", str(args.path), "--source", str(src), "--target", str(hyp)]
    command += ["--device", args.device, "--threads", str(args.threads)]
    with out.open("w") as stdout:
        stderr, _, _ = run(command, stdout=stdout)
    return logged_seconds(stderr, SCORED)


def longest_words(line: str, n: int) -> list[str]:
    """The n longest distinct words of a line (the first of equal length first), in the line's order."""
    words = list(dict.fromkeys(line.split()))
    chosen = set(sorted(words, key=lambda w: (-len(w), words.index(w)))[:n])
    return [w for w in words if w in chosen]


CONSTRAINTS, PREFIXES = WORK / "bench-decoding-constraints.txt", WORK / "bench-decoding-prefixes.txt"


def write_inputs(hyps: list[str], constraints: Path = CONSTRAINTS, prefixes: Path = PREFIXES) -> None:
    """The constraints file (two words of each baseline translation, tab-separated) and the prefix file (its first
    word), a line per input."""
    constraints.write_text("".join("\t".join(longest_words(h, 2)) + "\n" for h in hyps), encoding="utf-8")
    prefixes.write_text("".join((h.split() or [""])[0] + "\n" for h in hyps), encoding="utf-8")


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def check_output(name: str, hyps: list[str], baseline: list[str]) -> str:
    """What a feature's translations show it did (a feature that silently did nothing would look cheap): every
    output holds its constraints, begins with its prefix; an ensemble's outputs beside the baseline's."""
    constraints = [line.split("\t") if line else [] for line in read_lines(CONSTRAINTS)]
    prefixes = read_lines(PREFIXES)
    if name == "2 constraints":
        met = sum(all(c in h for c in cs) for h, cs in zip(hyps, constraints))
        return f"{met}/{len(constraints)} hold their constraints"
    if name == "target prefix":
        return f"{sum(h.startswith(p) for h, p in zip(hyps, prefixes))}/{len(prefixes)} begin with their prefix"
    if name == "ensemble of 2":
        return f"{sum(h == b for h, b in zip(hyps, baseline))}/{len(baseline)} equal the baseline's"
    return ""


def runs(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each generate run's options beside the others' (--path included)."""
    path = str(args.path)
    return {
        "beam 4 (baseline)": ["--path", path],
        "ensemble of 2": ["--path", f"{path}:{args.path2 or path}"],
        "2 constraints": ["--path", path, "--constraints-file", str(CONSTRAINTS)],
        "target prefix": ["--path", path, "--prefix-file", str(PREFIXES)],
        "no-repeat-ngram 3": ["--path", path, "--no-repeat-ngram-size", "3"],
        "alignment hard": ["--path", path, "--print-alignment", "hard", "--output-format", "jsonl"],
    }


def features() -> list[Feature]:
    return [
        Feature("beam 4 (baseline)", "", ""),
        Feature("ensemble of 2", "--weights", "<= 2.2x time", 2.2),
        Feature("2 constraints", "--constraints-file", "<= 3x time", 3.0),
        Feature("target prefix", "--prefix-file", ""),
        Feature("no-repeat-ngram 3", "--no-repeat-ngram-size", ""),
        Feature("alignment hard", "--print-alignment", ""),
        Feature("score-pairs", "score-pairs", ">= 10x sent/s", 10.0),
    ]


def rows_of(table: list[Feature], n_sentences: int) -> list[dict]:
    """The printed rows: median seconds, sentences/s, the multiple of the baseline and whether it meets its target."""
    base_rate = n_sentences / statistics.median(table[0].seconds)
    rows = []
    for f in table:
        row: dict = {"feature": f.name, "seconds": "not available", "sent/s": "", "x baseline": "", "target": f.target}
        row["check"] = f.check
        if f.error:
            row["seconds"] = f"failed: {f.error}"
        elif f.available:
            seconds = statistics.median(f.seconds)
            rate = (f.sentences or n_sentences) / seconds
            scoring = f.name == "score-pairs"
            multiple = rate / base_rate if scoring else base_rate / rate  # scoring: its sentences/s over search's
            row |= {"seconds": round(seconds, 3), "sent/s": round(rate, 1)}
            row["x baseline"] = f"{multiple:.2f}x " + ("sent/s" if scoring else "time")
            if f.limit is not None:
                row["target"] += " (met)" if (multiple >= f.limit if scoring else multiple <= f.limit) else " (missed)"
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", type=Path, required=True, help="Checkpoint (the issue's: transformer_small, Multi30k).")
    ap.add_argument("--path2", type=Path, default=None, help="The ensemble's second checkpoint [default: --path].")
    ap.add_argument("--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=1, help="Each command reads the sentences this many times over.")
    ap.add_argument(
        "--score-repeat", type=int, default=1, help="score-pairs reads the baseline's pairs this many times over again."
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="Rounds of alternated runs; each figure is their median.")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--tiny", action="store_true", help="Digit sentences, one round: seconds.")
    ap.add_argument("--conditions", default="", help="How the machine was (idle, under load), for the record.")
    args = ap.parse_args()
    if args.tiny:
        lines, args.rounds = TINY_SENTENCES, 1
    else:
        lines = args.input.read_text(encoding="utf-8").splitlines()[: args.sentences] * args.repeat
    WORK.mkdir(parents=True, exist_ok=True)
    src, hyp, out = (WORK / f"bench-decoding-{name}.txt" for name in ("input", "baseline", "output"))
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")

    table = features()
    score_src, score_hyp = WORK / "bench-decoding-score-input.txt", WORK / "bench-decoding-score-baseline.txt"
    scorer = next(f for f in table if f.name == "score-pairs")
    scorer.sentences = len(lines) * args.score_repeat
    generate_help, commands = help_text("generate"), help_text()
    for f in table[1:]:
        f.available = f.option in (commands if f.name == "score-pairs" else generate_help)
    options = runs(args)
    if args.device == "cuda":  # untimed: the first CUDA process of a run compiles and caches kernels
        generate(args, src, hyp, options[table[0].name])
    for turn in range(args.rounds):
        table[0].seconds.append(generate(args, src, hyp, options[table[0].name]))
        if turn == 0:  # the baseline's translations make the constraints and prefixes, and the pairs to score
            write_inputs(read_lines(hyp))
            for path, text in ((score_src, src), (score_hyp, hyp)):
                path.write_text(text.read_text(encoding="utf-8") * args.score_repeat, encoding="utf-8")
        for f in table[1:]:
            if f.available and not f.error:
                try:
                    scoring = f.name == "score-pairs"
                    f.seconds.append(
                        score_pairs(args, score_src, score_hyp, out)
                        if scoring
                        else generate(args, src, out, options[f.name])
                    )
                except SystemExit as e:  # reported in the table, and the exit status
                    f.error = str(e).strip().splitlines()[-1]
                if turn == 0 and not f.error and not scoring:
                    f.check = check_output(f.name, read_lines(out), read_lines(hyp))
    rows = rows_of(table, len(lines))
    for row in rows:
        row["conditions"] = args.conditions or "not given"
    report("decoding", rows)
    repeated = f" ({args.sentences} read {args.repeat} times over)" if args.repeat > 1 and not args.tiny else ""
    if args.score_repeat > 1:
        repeated += f"; score-pairs read them {args.score_repeat} times over again"
    print(
        f"{len(lines)} sentences{repeated}, beam {args.beam}, {args.threads} threads, {args.device}, "
        f"{args.rounds} round(s)"
    )
    print(f"machine: {json.dumps(machine())}")
    if any(f.error for f in table):
        raise SystemExit("some features failed (their rows say why)")


if __name__ == "__main__":
    sys.exit(main())
