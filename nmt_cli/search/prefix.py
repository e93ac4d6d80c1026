"""Target prefixes (`nmt generate --prefix-file`, serve's `prefix`, as fairseq's --prefix-size and CTranslate2's
target_prefix): each output begins with its sentence's given pieces, forced and scored (a row inside its prefix may
write only the prefix's next token), the search going on freely after it. A prefix is raw text encoded on its own,
so it should end on a word boundary: a prefix cut inside a word may split into other pieces than the full
translation would.

Shapes: B sentences of a batch, N rows (sentences x beams, sentence-major), V vocabulary, P the batch's longest
prefix."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import UNK, Vocab
from nmt_cli.errors import DataError
from nmt_cli.search.beam import max_lengths
from nmt_cli.search.ngram import repeated_ngram

NEG_INF = float("-inf")


class PrefixState:
    """Each row's prefix, reordered with its beams."""

    def __init__(self, tokens: Tensor, lengths: Tensor) -> None:
        self.tokens = tokens  # [N, P] PAD after each prefix
        self.lengths = lengths  # [N]

    def select(self, rows: Tensor) -> PrefixState:
        return PrefixState(self.tokens[rows], self.lengths[rows])


class PrefixConstraint:
    """Forces each sentence's prefix, token by token, from the first step."""

    rank_candidates = None  # beam search takes the best candidates by score

    def __init__(self, tokens: Tensor, lengths: Tensor) -> None:
        self.tokens = tokens  # [B, P] on the device
        self.lengths = lengths  # [B]

    def start(self, n_leaves: Tensor) -> PrefixState:
        """One row per entry of n_leaves [N] (ignored but for its length), rows sentence-major (N = B*K)."""
        beams = n_leaves.shape[0] // self.tokens.shape[0]
        return PrefixState(self.tokens.repeat_interleave(beams, 0), self.lengths.repeat_interleave(beams, 0))

    def mask(self, log_probs: Tensor, state: PrefixState, step: int, max_len: Tensor) -> Tensor:
        """log_probs [N, V]: at a row still inside its prefix, -inf but at the prefix's token of this step."""
        if step >= state.tokens.shape[1]:  # past every prefix of the batch (known on the host)
            return log_probs
        forced = state.lengths > step  # [N]
        token = state.tokens[:, step, None]  # [N, 1]
        only = torch.full_like(log_probs, NEG_INF).scatter_(1, token, log_probs.gather(1, token))
        return torch.where(forced[:, None], only, log_probs)

    def advance(self, state: PrefixState, tokens: Tensor) -> PrefixState:
        return state


class PrefixSource:
    """The prefixes of the sources given to `translate` (one each, in order; empty: none), as a ConstraintSource."""

    def __init__(self, prefixes: Sequence[Sequence[int] | np.ndarray]) -> None:
        self.prefixes = [np.asarray(p, dtype=np.int64) for p in prefixes]

    def for_batch(self, src: Tensor, src_lens: Tensor, ids: np.ndarray) -> tuple[PrefixConstraint, Tensor]:
        lengths = [len(self.prefixes[i]) for i in ids]
        tokens = np.zeros((len(ids), max(lengths, default=0)), dtype=np.int64)  # PAD is 0
        for row, i in enumerate(ids):
            tokens[row, : lengths[row]] = self.prefixes[i]
        constraint = PrefixConstraint(
            torch.from_numpy(tokens).to(src.device), torch.tensor(lengths, dtype=torch.long).to(src.device)
        )
        return constraint, torch.zeros(len(ids), dtype=torch.long, device=src.device)


def prefix_source(prefixes: Sequence[Sequence[int] | np.ndarray]) -> PrefixSource | None:
    """The ConstraintSource of these prefixes, or None when every one is empty (the search is then today's)."""
    return PrefixSource(prefixes) if any(len(p) for p in prefixes) else None


def prefix_problem(prefix: np.ndarray, src_len: int, cfg: SearchConfig, max_positions: int) -> str | None:
    """What keeps `prefix` from beginning the output of a source of `src_len` pieces, or None.

    The prefix must be in the model's vocabulary and fit the output's maximum length (a * |x| + b within the
    model's positions, |x| cut to the positions as `translate` cuts it), an empty source gets an empty output
    without a search, and under --no-repeat-ngram-size N the prefix itself may not repeat an n-gram."""
    if not len(prefix):
        return None
    if UNK in prefix:
        return "has characters the model's vocabulary lacks (they would be forced as the unknown piece); drop them"
    if src_len == 0:
        return "is given for an empty input, which gets an empty output; drop the prefix or give an input"
    longest = int(max_lengths(torch.tensor([min(src_len, max_positions - 1)]), cfg, max_positions)[0])
    if len(prefix) > longest:
        return (
            f"has {len(prefix)} pieces, more than the {longest} this input's output may have (a * |x| + b with "
            "--max-len-a/--max-len-b, within the model's positions); shorten it or raise --max-len-b"
        )
    n = cfg.no_repeat_ngram_size
    if n and repeated_ngram(prefix.tolist(), n) is not None:
        return f"repeats an n-gram of {n} pieces, which --no-repeat-ngram-size {n} forbids; shorten it or raise N"
    return None


def checked_prefixes(
    vocab: Vocab,
    texts: Sequence[str],
    src_lens: Sequence[int],
    cfg: SearchConfig,
    max_positions: int,
    where: Sequence[str],
) -> list[np.ndarray]:
    """Each text's pieces (the checkpoint's sentencepiece model; "" gives none), checked to begin the output of a
    source of src_lens[i] pieces.

    Raises:
        DataError: `WHERE: the prefix ...` (where[i]) for a prefix that cannot (`prefix_problem`).
    """
    prefixes = vocab.encode_arrays(texts)
    for prefix, n, name in zip(prefixes, src_lens, where):
        if problem := prefix_problem(prefix, n, cfg, max_positions):
            raise DataError(f"{name}: the prefix {problem}")
    return prefixes
