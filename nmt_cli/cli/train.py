"""`nmt train`: the model flags override the --arch preset; --eval-bleu-* set the validation search."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, config_options, precision_aliases, precision_from, take
from nmt_cli.config import ARCHITECTURES, ModelConfig, SearchConfig, TrainConfig, model_config

EVAL_PREFIX = "eval_bleu_"
EVAL_SEARCH_FIELDS = ("beam", "lenpen", "lenpen_style", "max_len_a", "max_len_b")


@click.command(context_settings=CONTEXT)
@config_options(TrainConfig)
@precision_aliases
@click.option(
    "--arch",
    default="transformer_base",
    type=click.Choice(list(ARCHITECTURES)),
    help="Preset shape; the model flags below override it.",
)
@config_options(ModelConfig, default_note=lambda f: "the --arch preset's")
@config_options(SearchConfig, prefix=EVAL_PREFIX, only=EVAL_SEARCH_FIELDS)
def train(arch: str, **values: Any) -> None:
    """Train a Transformer on a data directory made by `nmt preprocess`."""
    from nmt_cli.commands.train import train as train_model

    values["precision"] = precision_from(values)
    model = model_config(arch, **take(ModelConfig, values, drop_none=True))
    search = SearchConfig(**take(SearchConfig, values, prefix=EVAL_PREFIX))
    stopped = train_model(TrainConfig(**take(TrainConfig, values)), model, search)
    if stopped.exit_status:  # stopped by a signal, checkpoint_last.pt saved: 130 or 143
        raise SystemExit(stopped.exit_status)
