"""`nmt score`: sacreBLEU and chrF with their signatures; Moses-tokenized BLEU on request."""

from __future__ import annotations

import json
from pathlib import Path

import click

from nmt_cli.cli.options import CONTEXT, EXISTING_FILE


@click.command(context_settings=CONTEXT)
@click.option("--sys", "sys_path", required=True, type=EXISTING_FILE, help="Hypotheses: plain text or `nmt generate` fairseq output.")
@click.option("--ref", "ref_path", required=True, type=EXISTING_FILE, help="Reference text, one line per hypothesis.")
@click.option("--metric", "metrics", multiple=True, type=click.Choice(["sacrebleu", "chrf", "tok-bleu", "tok-bleu-compound"]),
              help="Repeatable [default: sacrebleu and chrf].")
@click.option("--lang", default="en", help="Language of the Moses tokenizer for tok-bleu metrics.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per metric.")
def score(sys_path: Path, ref_path: Path, metrics: tuple[str, ...], lang: str, as_json: bool) -> None:
    """Score translations: sacreBLEU (with its signature) and chrF; tokenized BLEU on request."""
    from nmt_cli.metrics import score_files

    for s in score_files(sys_path, ref_path, metrics or ("sacrebleu", "chrf"), lang):
        if as_json:
            click.echo(json.dumps({"metric": s.metric, "score": round(s.score, 2), "signature": s.signature}))
        else:
            click.echo(f"{s.text}  [{s.signature}]" if s.metric in ("sacrebleu", "chrf") else s.text)


