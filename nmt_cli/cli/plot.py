"""`nmt plot attention` and `nmt plot curves`: figures of what a model does (needs matplotlib: nmt[plot])."""

from __future__ import annotations

from pathlib import Path

import click

from nmt_cli.cli.options import CONTEXT, EXISTING_FILE
from nmt_cli.commands import plot as commands

FIGURE = click.Path(dir_okay=False, path_type=Path)


@click.group(context_settings=CONTEXT)
def plot() -> None:
    """Figures: a sentence's attention maps, training runs' learning curves (needs matplotlib: nmt[plot])."""


@plot.command("attention", context_settings=CONTEXT)
@click.option("--path", "checkpoint", required=True, type=EXISTING_FILE, help="Checkpoint to translate with.")
@click.option("--input", "sentence", required=True, help="The sentence (raw text) whose attention to draw.")
@click.option("--layer", type=click.IntRange(min=1), help="Layer, counted from 1 [default: the last].")
@click.option("--head", default="all", help="Head, counted from 1, or all.")
@click.option("--output", required=True, type=FIGURE, help="FILE.png, .svg or .pdf")
def plot_attention(checkpoint: Path, sentence: str, layer: int | None, head: str, output: Path) -> None:
    """Encoder self-, decoder self- and encoder-decoder attention of one sentence, as heat maps.

    The decoder side is the model's own greedy translation, teacher-forced; the weights are recorded
    from that forward pass (Transformer.forward with AttentionWeights)."""
    commands.plot_attention(checkpoint, sentence, layer, head, output)


@plot.command("curves", context_settings=CONTEXT)
@click.option(
    "--log-file",
    "log_files",
    required=True,
    multiple=True,
    type=EXISTING_FILE,
    help="A JSON-lines log of nmt train --log-file; repeat for several runs on one figure.",
)
@click.option("--label", "labels", multiple=True, help="Legend name of each --log-file, in order [default: file stem].")
@click.option("--output", required=True, type=FIGURE, help="FILE.png, .svg or .pdf")
def plot_curves(log_files: tuple[Path, ...], labels: tuple[str, ...], output: Path) -> None:
    """Train and valid loss, valid BLEU, learning rate and tokens/s against updates and wall clock."""
    commands.plot_curves(log_files, labels, output)
