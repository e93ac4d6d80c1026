"""`nmt generate`: the search flags default to the settings saved in the checkpoint; each per-sentence decoding
rule (search/rules.py's OPTIONS) has its --NAME-file."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, PATH_TYPES, inference_config, inference_options
from nmt_cli.config import GenerateConfig
from nmt_cli.search.rules import OPTIONS


@click.command(context_settings=CONTEXT)
@inference_options(GenerateConfig)
def generate(**values: Any) -> None:
    """Translate a binarized split (DATA_DIR) or raw text (--input) with beam search."""
    from nmt_cli.commands.generate import generate as generate_translations

    files = {rule.name: values.pop(f"{rule.name}_file") for rule in OPTIONS}
    values["rule_files"] = tuple((name, path) for name, path in files.items() if path is not None)
    generate_translations(*inference_config(GenerateConfig, values))


for rule in OPTIONS:
    generate = click.option(rule.file_option, f"{rule.name}_file", type=PATH_TYPES["file"], help=rule.help)(generate)
