"""Corpus metrics for `nmt score` and BLEU during training: sacreBLEU BLEU and chrF, and tokenized BLEU.

`tok-bleu` is BLEU on Moses-tokenized text (as multi-bleu.perl computed it); `tok-bleu-compound`
also splits hyphenated compounds (`a-b` -> `a ##AT##-##AT## b`) as the paper's EN-DE scores did
(tensor2tensor get_ende_bleu.sh). Neither is comparable with sacreBLEU, and both say so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sacrebleu

from nmt_cli.data import BOM, WORD_MARK, split_lines
from nmt_cli.errors import ConfigError, DataError

METRICS = ("sacrebleu", "chrf", "tok-bleu", "tok-bleu-compound")


@dataclass
class Score:
    metric: str
    score: float
    text: str  # sacreBLEU's formatted line or ours
    signature: str


# Every metric takes its references as sacreBLEU does: a list of streams, each one reference per hypothesis
# (several streams: multi-reference scores).
References = Sequence[Sequence[str]]


def sacrebleu_score(hyps: Sequence[str], refs: References) -> Score:
    bleu = sacrebleu.metrics.BLEU()
    result = bleu.corpus_score(list(hyps), [list(stream) for stream in refs])
    sig = str(bleu.get_signature())
    return Score("sacrebleu", result.score, str(result), sig)


def chrf_score(hyps: Sequence[str], refs: References) -> Score:
    chrf = sacrebleu.metrics.CHRF()
    result = chrf.corpus_score(list(hyps), [list(stream) for stream in refs])
    return Score("chrf", result.score, str(result), str(chrf.get_signature()))


def moses_tokenize(lines: Sequence[str], lang: str, split_compounds: bool) -> list[str]:
    from sacremoses import MosesTokenizer
    from sacremoses.corpus import NonbreakingPrefixes

    # Its language codes (not names: its own rules test the code, e.g. lang == "en" for apostrophes); an
    # unknown lang would silently tokenize without the language's rules.
    codes = sorted(k for k in NonbreakingPrefixes().available_langs if len(k) <= 3)
    if lang not in codes:
        known = ", ".join(codes)
        raise ConfigError(f"--lang {lang!r} is not a language code of the Moses tokenizer; use one of {known}")
    tok = MosesTokenizer(lang=lang)
    out = []
    for line in lines:
        text = tok.tokenize(line, return_str=True, escape=False)
        if split_compounds:
            text = re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", text)
        out.append(text)
    return out


def tokenized_bleu(hyps: Sequence[str], refs: References, lang: str, split_compounds: bool) -> Score:
    name = "tok-bleu-compound" if split_compounds else "tok-bleu"
    result = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(
        moses_tokenize(hyps, lang, split_compounds),
        [moses_tokenize(stream, lang, split_compounds) for stream in refs],
    )
    note = f"Moses-tokenized ({lang}){', compounds split' if split_compounds else ''}; NOT comparable with sacreBLEU"
    return Score(name, result.score, f"{name.upper()} = {result.score:.2f} ({note})", note)


def compute(metric: str, hyps: Sequence[str], refs: References, lang: str = "en") -> Score:
    if metric == "sacrebleu":
        return sacrebleu_score(hyps, refs)
    if metric == "chrf":
        return chrf_score(hyps, refs)
    return tokenized_bleu(hyps, refs, lang, split_compounds=metric == "tok-bleu-compound")


_FAIRSEQ_LINE = re.compile(r"^([STHDP])-(\d+)\t")


def read_text(path: Path) -> list[str]:
    if path.is_dir():
        raise DataError(f"{path} is a directory; give a text file")
    if not path.exists():
        raise DataError(f"file {path} does not exist")
    try:
        # bytes decoded, not read_text: text mode would also end a line at a lone "\r", which generate (and
        # sacreBLEU) keep inside it. A byte-order mark (Windows editors write one) is not text to score.
        return split_lines(path.read_bytes().decode("utf-8").removeprefix(BOM))
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: invalid UTF-8") from None


def read_hypotheses(path: Path) -> list[str]:
    """Plain text, one hypothesis per line, or `nmt generate` output: fairseq format (D- lines by id) or
    jsonl (each record's best hypothesis by id)."""
    lines = read_text(path)
    if lines and lines[0].startswith('{"id": '):
        best: dict[int, str] = {}
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                best.setdefault(int(record["id"]), record["hypotheses"][0]["text"])
            except (ValueError, KeyError, IndexError, TypeError):
                raise DataError(f"{path}:{number}: not a record of `nmt generate --output-format jsonl`") from None
        return [best[i] for i in sorted(best)]
    if any(lines) and all(_FAIRSEQ_LINE.match(line) for line in lines if line):  # empty lines alone: plain text
        detok = {}
        for line in lines:
            match = _FAIRSEQ_LINE.match(line)
            if match and match.group(1) == "D" and int(match.group(2)) not in detok:
                detok[int(match.group(2))] = line.split("\t", 2)[2] if line.count("\t") >= 2 else ""
        return [detok[i] for i in sorted(detok)]
    return lines


def score_files(sys_path: Path, ref_paths: Sequence[Path], metrics: Sequence[str], lang: str) -> list[Score]:
    """Score a system output against one or more reference files (each a reference per hypothesis) with each
    metric; several references score as sacreBLEU's multi-reference BLEU and chrF."""
    hyps = read_hypotheses(sys_path)
    streams = [check_references(sys_path, len(hyps), path) for path in ref_paths]
    if looks_like_trees(hyps) and looks_like_trees(streams[0]):
        raise DataError(
            f"{sys_path} and {ref_paths[0]} hold bracketed trees (a parsing model's output?); "
            "score them with --metric bracket-f1"
        )
    for i, hyp in enumerate(hyps, start=1):
        if WORD_MARK in hyp:
            raise DataError(
                f"{sys_path}: hypothesis {i} still contains sentencepiece pieces ({WORD_MARK}); "
                "score the detokenized output (D- lines or plain `nmt generate --input`)"
            )
    return [compute(m, hyps, streams, lang) for m in metrics]


def check_references(sys_path: Path, n_hyps: int, ref_path: Path) -> list[str]:
    """The reference file's lines: one per hypothesis, raw text."""
    refs = read_text(ref_path)
    if not refs:
        raise DataError(f"{ref_path} is empty; there is nothing to score")
    if n_hyps != len(refs):
        raise DataError(f"{sys_path} has {n_hyps} hypotheses but {ref_path} has {len(refs)} lines")
    for i, ref in enumerate(refs, start=1):
        if WORD_MARK in ref:
            raise DataError(
                f"{ref_path}:{i}: the reference contains sentencepiece pieces ({WORD_MARK}); give the raw reference "
                "text (such as the files preprocess read)"
            )
    return refs


def looks_like_trees(lines: Sequence[str]) -> bool:
    """True when every non-empty line is bracketed like a tree (to catch trees given to BLEU)."""
    nonempty = [line.strip() for line in lines if line.strip()]
    return bool(nonempty) and all(line.startswith("(") and line.endswith(")") for line in nonempty)
