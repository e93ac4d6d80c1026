"""`nmt preprocess`: train a joint sentencepiece model and binarize the splits."""

from __future__ import annotations

import json
from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, config_options
from nmt_cli.config import PreprocessConfig, parses_trees


@click.command(context_settings=CONTEXT)
@config_options(PreprocessConfig)
def preprocess(**values: Any) -> None:
    """Train a joint sentencepiece model and binarize train/valid/test."""
    from nmt_cli.data.preprocess import preprocess as preprocess_data
    from nmt_cli.parsing.preprocess import preprocess_trees

    cfg = PreprocessConfig(**values)
    meta = preprocess_trees(cfg) if parses_trees(cfg.target_format) else preprocess_data(cfg)
    click.echo(json.dumps({k: meta[k] for k in ("source_lang", "target_lang", "vocab_size", "splits")}))
