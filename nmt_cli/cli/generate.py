"""`nmt generate`: the search flags default to the settings saved in the checkpoint."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, config_options, precision_aliases, precision_from, take
from nmt_cli.config import GenerateConfig, SearchConfig


@click.command(context_settings=CONTEXT)
@config_options(GenerateConfig)
@precision_aliases
@config_options(SearchConfig, default_note=lambda f: f"the checkpoint's, else {f.default}")
def generate(**values: Any) -> None:
    """Translate a binarized split (DATA_DIR) or raw text (--input) with beam search."""
    from nmt_cli.commands.generate import generate as generate_translations

    values["precision"] = precision_from(values)
    search_overrides = take(SearchConfig, values, drop_none=True)
    generate_translations(GenerateConfig(**take(GenerateConfig, values)), search_overrides)
