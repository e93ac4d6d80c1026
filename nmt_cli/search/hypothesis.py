"""What every search returns for a sentence: output ids, score, and the log-prob of each token (and, when asked,
its alignment to the source); and a hypothesis as a record (jsonl output, `nmt serve`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt_cli.data.vocab import Vocab


@dataclass
class Alignment:
    """A hypothesis aligned to its source (search/forced.py): weights [T, S], T its tokens and S its source's
    pieces (EOS excluded on both sides), each row summing to 1 over the source. hard: written as each token's most
    attended source piece (fairseq's `S-T` pairs), else as the weights themselves."""

    weights: np.ndarray  # [T, S] float32
    hard: bool

    def pairs(self) -> list[tuple[int, int]]:
        """(source index, target index) of each target token's most attended source piece, in target order."""
        if self.weights.shape[1] == 0:
            return []
        return [(int(s), t) for t, s in enumerate(self.weights.argmax(1))]

    def text(self) -> str:
        """fairseq's A- line: hard `S-T S-T ...`; soft each token's source weights comma-separated, tokens
        space-separated."""
        if self.hard:
            return " ".join(f"{s}-{t}" for s, t in self.pairs())
        return " ".join(",".join(f"{w:.6f}" for w in row) for row in self.weights.tolist())

    def record(self) -> str | list[list[float]]:
        """The jsonl (and serve) value: the hard pairs as fairseq writes them, or the soft matrix as rows."""
        return self.text() if self.hard else [[round(w, 4) for w in row] for row in self.weights.tolist()]


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids without EOS
    score: float  # sum of log-probs (nats) divided by the length penalty
    positional_scores: list[float]  # log-prob of every token, EOS included
    alignment: Alignment | None = None  # set after the search when asked (search/forced.py's add_alignments)

    @property
    def found(self) -> bool:
        """False for `nothing_found()`: no output keeps every rule its search followed."""
        return math.isfinite(self.score)


NOTHING_FOUND = (
    "no output keeps its constraints, prefix and --no-repeat-ngram-size together within its maximum length; the "
    "output is empty (raise --max-len-b, or drop a rule)"
)


def nothing_found() -> Hypothesis:
    """A sentence's one result when its search finished no hypothesis: its rules (lexical constraints, a prefix,
    --no-repeat-ngram-size) together left no way to end within its maximum length. Empty, scored -inf; the search
    checks what it can up front (search/lexical.py, search/prefix.py), so this is the rare case they miss."""
    return Hypothesis([], -math.inf, [])


def hypothesis_record(h: Hypothesis, vocab: Vocab) -> dict[str, Any]:
    """One hypothesis as jsonl output (and `nmt serve`) give it: text, score (nats), pieces, their scores, and
    the alignment when one was asked for."""
    record: dict[str, Any] = {
        "text": vocab.decode(h.tokens),
        "score": round(h.score, 4) if h.found else None,  # JSON has no -inf
        "tokens": vocab.pieces(h.tokens),
        "positional_scores": [round(s, 4) for s in h.positional_scores],
    }
    if h.alignment is not None:
        record["alignment"] = h.alignment.record()
    return record
