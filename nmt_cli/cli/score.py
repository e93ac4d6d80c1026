"""`nmt score`: sacreBLEU and chrF with their signatures; Moses-tokenized BLEU on request."""

from __future__ import annotations

from pathlib import Path

import click

from nmt_cli.cli.options import CONTEXT, EXISTING_FILE


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
    from nmt_cli.commands.score import score as score_command

    for line in score_command(sys_path, ref_paths, metrics, lang, as_json, verbose):
        click.echo(line)
