"""`nmt serve`: the search flags default to the settings saved in the checkpoint, as in `nmt generate`."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, config_options, precision_aliases, precision_from, take
from nmt_cli.config import SearchConfig, ServeConfig


@click.command(context_settings=CONTEXT)
@config_options(ServeConfig)
@precision_aliases
@config_options(SearchConfig, default_note=lambda f: f"the checkpoint's, else {f.default}")
def serve(**values: Any) -> None:
    """Translate over HTTP (POST /translate, a page at /), batching sentences across requests (needs nmt[serve])."""
    from nmt_cli.commands.serve import serve as run_server

    values["precision"] = precision_from(values)
    search_overrides = take(SearchConfig, values, drop_none=True)
    run_server(ServeConfig(**take(ServeConfig, values)), search_overrides)
