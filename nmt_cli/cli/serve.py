"""`nmt serve`: the search flags default to the settings saved in the checkpoint, as in `nmt generate`; --path is
repeatable (several models in one server)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, inference_config, inference_options
from nmt_cli.config import ServeConfig

PATH_HELP = next(f.metadata["help"] for f in fields(ServeConfig) if f.name == "path")


@click.command(context_settings=CONTEXT)
@click.option("--path", multiple=True, required=True, metavar="[NAME=]CKPT", help=PATH_HELP)
@inference_options(ServeConfig)
def serve(path: tuple[str, ...], **values: Any) -> None:
    """Translate over HTTP (POST /translate, a page at /), batching sentences across requests (needs nmt[serve])."""
    from nmt_cli.commands.serve import serve as run_server

    run_server(*inference_config(ServeConfig, {**values, "path": path[0], "more_paths": path[1:]}))
