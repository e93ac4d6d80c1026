"""`nmt score`: sacreBLEU and chrF with their signatures; Moses-tokenized BLEU on request."""

from __future__ import annotations

import json
from pathlib import Path

import click

from nmt_cli.cli.options import CONTEXT, EXISTING_FILE
from nmt_cli.errors import ConfigError


@click.command(context_settings=CONTEXT)
@click.option(
    "--sys",
    "sys_path",
    required=True,
    type=EXISTING_FILE,
    help="Hypotheses: plain text, or `nmt generate` output (fairseq or jsonl: the best per input, by id).",
)
@click.option(
    "--ref",
    "ref_paths",
    required=True,
    multiple=True,
    type=EXISTING_FILE,
    help="Reference text, one line per hypothesis; repeat it for multi-reference BLEU and chrF.",
)
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    type=click.Choice(["sacrebleu", "chrf", "tok-bleu", "tok-bleu-compound", "bracket-f1"]),
    help="Repeatable [default: sacrebleu and chrf]. bracket-f1: EVALB (COLLINS.prm) on trees, alone.",
)
@click.option("--lang", default="en", help="Language of the Moses tokenizer for tok-bleu metrics.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per metric.")
@click.option("--verbose", is_flag=True, help="bracket-f1: also EVALB's line per sentence.")
def score(
    sys_path: Path, ref_paths: tuple[Path, ...], metrics: tuple[str, ...], lang: str, as_json: bool, verbose: bool
) -> None:
    """Score translations: sacreBLEU (with its signature) and chrF; tokenized BLEU on request; trees: bracket-f1."""
    from nmt_cli.metrics import score_files

    if lang != "en" and not any(m.startswith("tok-bleu") for m in metrics):
        raise ConfigError(f"--lang {lang} sets the Moses tokenizer of tok-bleu metrics; give one with --metric")
    if verbose and "bracket-f1" not in metrics:
        raise ConfigError("--verbose adds EVALB's line per sentence to --metric bracket-f1; give that metric")
    if "bracket-f1" in metrics:  # constituency trees (nmt_cli/parsing/evalb.py)
        from nmt_cli.parsing.evalb import COLLINS, format_report, report_json, score_tree_files

        if len(set(metrics)) > 1:
            raise ConfigError("--metric bracket-f1 scores trees; give it alone")
        if len(ref_paths) > 1:
            raise ConfigError("--metric bracket-f1 compares with one gold tree file; give one --ref")
        result = score_tree_files(sys_path, ref_paths[0])
        report = report_json(result, COLLINS, verbose) if as_json else None
        click.echo(json.dumps(report) if report else format_report(result, COLLINS, verbose))
        return

    for s in score_files(sys_path, ref_paths, metrics or ("sacrebleu", "chrf"), lang):
        if as_json:
            click.echo(json.dumps({"metric": s.metric, "score": round(s.score, 2), "signature": s.signature}))
        else:
            click.echo(f"{s.text}  [{s.signature}]" if s.metric in ("sacrebleu", "chrf") else s.text)
