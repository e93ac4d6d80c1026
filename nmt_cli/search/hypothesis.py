"""What every search returns for a sentence: output ids, score, and the log-prob of each token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids without EOS
    score: float  # sum of log-probs (nats) divided by the length penalty
    positional_scores: list[float]  # log-prob of every token, EOS included
