"""`nmt serve`: the search flags default to the settings saved in the checkpoint, as in `nmt generate`."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, inference_config, inference_options
from nmt_cli.config import ServeConfig


@click.command(context_settings=CONTEXT)
@inference_options(ServeConfig)
def serve(**values: Any) -> None:
    """Translate over HTTP (POST /translate, a page at /), batching sentences across requests (needs nmt[serve])."""
    from nmt_cli.commands.serve import serve as run_server

    run_server(*inference_config(ServeConfig, values))
