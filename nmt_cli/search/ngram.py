"""No repeated n-grams (`--no-repeat-ngram-size N`, as fairseq's and CTranslate2's): no n-gram of N tokens occurs
twice in an output. A Constraint (search/constraint.py) that beam search, greedy search and sampling follow, on
the device without a host synchronisation: each row keeps the tokens it has generated, and each step bans the
tokens that followed earlier occurrences of the row's last N-1 tokens.

Shapes: N rows (sentences x beams), V vocabulary, t tokens generated so far, W = t - N + 1 earlier n-grams.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import EOS

NEG_INF = float("-inf")


class NgramState:
    """Each row's generated tokens, reordered with its beams."""

    def __init__(self, tokens: Tensor) -> None:
        self.tokens = tokens  # [N, t]

    def select(self, rows: Tensor) -> NgramState:
        return NgramState(self.tokens[rows])


class NoRepeatNgram:
    """Bans every token that would complete an n-gram of `size` tokens the row has already generated; also its
    own ConstraintSource (the same rules for every batch)."""

    rank_candidates = None  # beam search takes the best candidates by score

    def __init__(self, size: int) -> None:
        assert size >= 1, "an n-gram has at least one token"
        self.size = size

    def for_batch(self, src: Tensor, src_lens: Tensor, ids: np.ndarray) -> tuple[NoRepeatNgram, Tensor]:
        return self, torch.zeros(len(ids), dtype=torch.long, device=src.device)

    def start(self, n_leaves: Tensor) -> NgramState:
        return NgramState(torch.zeros(n_leaves.shape[0], 0, dtype=torch.long, device=n_leaves.device))

    def mask(self, log_probs: Tensor, state: NgramState, step: int, max_len: Tensor) -> Tensor:
        """log_probs [N, V] with -inf at each token that follows an earlier occurrence of the row's last N-1."""
        n, (rows, t) = self.size, state.tokens.shape
        if t < n:  # no complete n-gram yet (t is known on the host)
            return log_probs
        windows = state.tokens.unfold(1, n, 1)  # [N, W, n] every n-gram generated so far
        last = state.tokens[:, t - n + 1 :]  # [N, n-1] the n-gram the next token completes, without it
        follower = windows[:, :, n - 1]  # [N, W]
        # EOS is never banned: it ends the row (a finished greedy row keeps stepping, EOS among its tokens).
        seen = (windows[:, :, : n - 1] == last[:, None, :]).all(-1) & (follower != EOS)  # [N, W]
        v = log_probs.shape[1]
        # Unmatched n-grams write to a spare column V: every write is True, so the order of writes is irrelevant.
        banned = torch.where(seen, follower, v)  # [N, W]
        ban = torch.zeros(rows, v + 1, dtype=torch.bool, device=log_probs.device).scatter_(1, banned, True)
        return log_probs.masked_fill(ban[:, :v], NEG_INF)

    def advance(self, state: NgramState, tokens: Tensor) -> NgramState:
        return NgramState(torch.cat([state.tokens, tokens[:, None]], dim=1))


def no_repeat_ngrams(cfg: SearchConfig) -> NoRepeatNgram | None:
    """The ban of repeated n-grams that cfg.no_repeat_ngram_size asks for, or None (0: off)."""
    return NoRepeatNgram(cfg.no_repeat_ngram_size) if cfg.no_repeat_ngram_size else None


def repeated_ngram(tokens: list[int], size: int) -> tuple[int, ...] | None:
    """The first n-gram of `size` tokens that occurs twice in `tokens`, or None (a prefix forced under
    --no-repeat-ngram-size must have none)."""
    seen: set[tuple[int, ...]] = set()
    for i in range(len(tokens) - size + 1):
        gram = tuple(tokens[i : i + size])
        if gram in seen:
            return gram
        seen.add(gram)
    return None
