"""`nmt preprocess`: train a joint sentencepiece model and binarize the splits."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, config_options
from nmt_cli.config import PreprocessConfig


@click.command(context_settings=CONTEXT)
@config_options(PreprocessConfig)
def preprocess(**values: Any) -> None:
    """Train a joint sentencepiece model and binarize train/valid/test."""
    from nmt_cli.commands.preprocess import preprocess as preprocess_command

    click.echo(preprocess_command(PreprocessConfig(**values)))
