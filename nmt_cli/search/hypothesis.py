"""What every search returns for a sentence: output ids, score, and the log-prob of each token; and a
hypothesis as a record (jsonl output, `nmt serve`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nmt_cli.data.vocab import Vocab


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids without EOS
    score: float  # sum of log-probs (nats) divided by the length penalty
    positional_scores: list[float]  # log-prob of every token, EOS included


def hypothesis_record(h: Hypothesis, vocab: Vocab) -> dict[str, Any]:
    """One hypothesis as jsonl output (and `nmt serve`) give it: text, score (nats), pieces, their scores."""
    return {
        "text": vocab.decode(h.tokens),
        "score": round(h.score, 4),
        "tokens": vocab.pieces(h.tokens),
        "positional_scores": [round(s, 4) for s in h.positional_scores],
    }
