"""`nmt generate`: the search flags default to the settings saved in the checkpoint."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, inference_config, inference_options
from nmt_cli.config import GenerateConfig


@click.command(context_settings=CONTEXT)
@inference_options(GenerateConfig)
def generate(**values: Any) -> None:
    """Translate a binarized split (DATA_DIR) or raw text (--input) with beam search."""
    from nmt_cli.commands.generate import generate as generate_translations

    generate_translations(*inference_config(GenerateConfig, values))
