"""`nmt score-pairs`: the model's score of given translations; the scoring settings default to the checkpoint's."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.cli.options import CONTEXT, config_options, inference_config, precision_aliases
from nmt_cli.config import ScorePairsConfig, SearchConfig

# The search settings a score reads (search/forced.py); the others decide which outputs a search finds, not how
# a given one scores.
SCORING_FIELDS = ("lenpen", "lenpen_style", "unkpen")


@click.command("score-pairs", context_settings=CONTEXT)
@config_options(ScorePairsConfig)
@precision_aliases
@config_options(SearchConfig, only=SCORING_FIELDS, default_note=lambda f: f"the checkpoint's, else {f.default}")
def score_pairs(**values: Any) -> None:
    """Score given translations (--target) of --source with the model, as the search scores its hypotheses.

    One line per pair: the score (the log-prob of the target and EOS, in nats, less --unkpen per unknown piece,
    divided by the length penalty), or with --output-format jsonl the score, log_prob, tokens and token_scores.
    """
    from nmt_cli.commands.score_pairs import score_pairs as score_given_pairs

    score_given_pairs(*inference_config(ScorePairsConfig, values))
