"""`nmt export`: a checkpoint as a CTranslate2 model directory (needs `pip install "nmt[export]"`)."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, config_options
from nmt_cli.config import ExportConfig


@click.command(context_settings=CONTEXT)
@config_options(ExportConfig)
def export(**values: Any) -> None:
    """Write a checkpoint as a CTranslate2 model directory, the sentencepiece model beside it."""
    from nmt_cli.commands.export import export_checkpoint

    click.echo(str(export_checkpoint(ExportConfig(**values))))
