"""`nmt average-checkpoints`: average the weights of the last N (or the given) checkpoints."""

from __future__ import annotations

from pathlib import Path

import click

from nmt_cli.cli.options import CONTEXT, EXISTING_FILE, EXISTING_PATH


@click.command("average-checkpoints", context_settings=CONTEXT)
@click.option(
    "--inputs",
    required=True,
    multiple=True,
    type=EXISTING_PATH,
    help="Checkpoint files, or one directory (with --num-update-checkpoints). Repeat or list after it.",
)
@click.option(
    "--num-update-checkpoints",
    type=click.IntRange(min=1),
    help="Average the last N checkpoint_<update>.pt of the directory.",
)
@click.option("--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--force",
    is_flag=True,
    help="Replace an --output that holds a training state (a run resumes from it); an earlier average is "
    "replaced without it.",
)
@click.argument("more_inputs", nargs=-1, type=EXISTING_FILE)
def average_checkpoints(
    inputs: tuple[Path, ...],
    num_update_checkpoints: int | None,
    output: Path,
    force: bool,
    more_inputs: tuple[Path, ...],
) -> None:
    """Average the weights of several checkpoints (the paper averaged the last 5 or 20)."""
    from nmt_cli.commands.average import average

    average(list(inputs) + list(more_inputs), num_update_checkpoints, output, force)
