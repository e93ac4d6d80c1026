"""`nmt score`: sacreBLEU and chrF with their signatures; Moses-tokenized BLEU on request; EVALB's bracket F1 on
trees. Returns the lines to print, which the cli writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from nmt_cli.errors import ConfigError
from nmt_cli.metrics import score_files
from nmt_cli.parsing.evalb import COLLINS, format_report, report_json, score_tree_files


def score(
    sys_path: Path, ref_paths: Sequence[Path], metrics: Sequence[str], lang: str, as_json: bool, verbose: bool
) -> list[str]:
    """Score `sys_path` against `ref_paths` with each metric (sacrebleu and chrf when none is given)."""
    if lang != "en" and not any(m.startswith("tok-bleu") for m in metrics):
        raise ConfigError(f"--lang {lang} sets the Moses tokenizer of tok-bleu metrics; give one with --metric")
    if verbose and "bracket-f1" not in metrics:
        raise ConfigError("--verbose adds EVALB's line per sentence to --metric bracket-f1; give that metric")
    if "bracket-f1" in metrics:  # constituency trees (nmt_cli/parsing/evalb.py)
        if len(set(metrics)) > 1:
            raise ConfigError("--metric bracket-f1 scores trees; give it alone")
        if len(ref_paths) > 1:
            raise ConfigError("--metric bracket-f1 compares with one gold tree file; give one --ref")
        result = score_tree_files(sys_path, ref_paths[0])
        report = report_json(result, COLLINS, verbose) if as_json else None
        return [json.dumps(report) if report else format_report(result, COLLINS, verbose)]

    lines = []
    for s in score_files(sys_path, ref_paths, metrics or ("sacrebleu", "chrf"), lang):
        if as_json:
            lines.append(json.dumps({"metric": s.metric, "score": round(s.score, 2), "signature": s.signature}))
        else:
            lines.append(f"{s.text}  [{s.signature}]" if s.metric in ("sacrebleu", "chrf") else s.text)
    return lines
