"""Lexically constrained decoding: every output contains each of its sentence's target phrases (fairseq's
--constraints, Sockeye's constraints), searched with dynamic beam allocation (Post & Vilar 2018; vectorised as
Hu et al. 2019).

Shapes: B sentences of a batch, K beam, N rows (sentences x beams), P phrases of the batch's most constrained
sentence, L pieces of its longest phrase, C candidates of a sentence, V vocabulary.

A phrase is met when its pieces occur contiguously in the output, in any order, overlapping or not. Each row
follows every unmet phrase's longest matched prefix (`pos`) with the phrase's KMP automaton. `need`, the pieces
still to write, is the unmet phrases' total length less the longest matched prefix among them. `mask` allows EOS
only once all are met, and no piece after which `need` exceeds the positions left, so that the last positions are
forced; a sentence whose phrases cannot fit its maximum length is refused up front (`check_fits`).

`rank_candidates` is the dynamic beam allocation: a sentence's candidates (its top 2K, the pieces of each beam that
advance an unmet phrase, each beam's best piece) are grouped in banks by constraint pieces met and the beam is dealt
across the banks round-robin, each bank's best first. An EOS candidate finishes when it is among the first K so
dealt, or among the K best by score, as plain beam search would finish it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import EOS, PAD, UNK, Vocab
from nmt_cli.errors import DataError
from nmt_cli.search.beam import max_lengths
from nmt_cli.search.ngram import repeated_ngram

NEG_INF = float("-inf")

Phrases = Sequence[Sequence[int]]  # one sentence's phrases, each a sequence of piece ids


@dataclass
class LexicalState:
    """Each row's progress; `select` reorders it with the beams."""

    sent: Tensor  # [N] the row's sentence in the batch
    pos: Tensor  # [N, P] longest matched prefix of each unmet phrase (0 for a met one)
    met: Tensor  # [N, P] bool, the phrase was met (or is padding)

    def select(self, rows: Tensor) -> LexicalState:
        """Reorder or subset rows [N'] (beams reordered, finished sentences removed)."""
        return LexicalState(self.sent[rows], self.pos[rows], self.met[rows])


class LexicalConstraint:
    """One batch's phrases; `mask`, `advance` and `rank_candidates` work on all rows at once, on the device."""

    def __init__(self, phrases: Sequence[Phrases], device: torch.device) -> None:
        b = len(phrases)
        p = max((len(s) for s in phrases), default=0)
        length = max((len(ph) for s in phrases for ph in s), default=0)
        table = np.full((b, p, max(length, 1)), PAD, dtype=np.int64)
        lens = np.zeros((b, p), dtype=np.int64)
        for i, sentence in enumerate(phrases):
            for j, phrase in enumerate(sentence):
                table[i, j, : len(phrase)], lens[i, j] = phrase, len(phrase)
        self.n_phrases = p  # 0: no sentence of the batch has a phrase; the search is then plain beam search
        self.table = torch.from_numpy(table).to(device)  # [B, P, L]
        self.lens = torch.from_numpy(lens).to(device)  # [B, P]
        self.borders = torch.from_numpy(borders(table, lens)).to(device)  # [B, P, L, L]: see `borders`
        self.totals = self.lens.sum(1)  # [B] pieces of all phrases
        self.max_total = int(lens.sum(1).max(initial=0))
        # The pieces that can move a row's state other than back to the start: every phrase's (PAD elsewhere)
        self.pieces = self.table.view(b, -1)  # [B, P*L]

    def start(self, n_leaves: Tensor) -> LexicalState:
        """The state of N rows, sentence-major (N = B * beams); n_leaves is read for its length only."""
        n, b = n_leaves.shape[0], self.lens.shape[0]
        assert n % b == 0, "rows are each sentence's beams in turn"
        sent = torch.arange(n, device=self.lens.device) // (n // b)
        return LexicalState(sent, torch.zeros_like(self.lens[sent]), self.lens[sent] == 0)

    def advance(self, state: LexicalState, tokens: Tensor) -> LexicalState:
        """The state after each row's piece [N]."""
        pos, met = self.step(state.sent, state.pos, state.met, tokens)
        return LexicalState(state.sent, pos, met)

    def step(self, sent: Tensor, pos: Tensor, met: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """pos, met [R, P] of rows of sentences sent [R] after pieces tokens [R]: each phrase's new matched prefix
        is the longest j with phrase[:j-1] a suffix of the matched prefix and phrase[j-1] the piece (KMP)."""
        table, lens = self.table[sent], self.lens[sent]  # [R, P, L], [R, P]
        length = table.shape[2]
        phrase = torch.arange(table.shape[1], device=sent.device)[None, :]
        border = self.borders[sent[:, None], phrase, pos.clamp(max=length - 1)]  # [R, P, L]
        fits = border & (table == tokens[:, None, None])  # [R, P, L]: prefix j = index + 1 matches
        j = torch.arange(1, length + 1, device=tokens.device)
        new_pos = (fits * j).amax(2)  # [R, P]
        met = met | (new_pos == lens)
        return new_pos.masked_fill(met, 0), met

    def need(self, sent: Tensor, pos: Tensor, met: Tensor) -> Tensor:
        """[R] pieces still to write: the unmet phrases' length less the longest matched prefix among them."""
        return (self.lens[sent] * ~met).sum(1) - (pos * ~met).amax(1)

    def mask(self, log_probs: Tensor, state: LexicalState, step: int, max_len: Tensor) -> Tensor:
        """log_probs [N, V] without EOS before every phrase is met, nor a piece after which the phrases no longer
        fit before max_len [N] (so that the last positions are forced)."""
        if self.n_phrases == 0:
            return log_probs
        n, width = log_probs.shape[0], self.pieces.shape[1]
        room = max_len - step - 1  # [N] positions left after this piece
        eos = log_probs[:, EOS].clone()
        need = self.need(state.sent, state.pos, state.met)
        other_ok = (self.lens[state.sent] * ~state.met).sum(1) <= room  # a piece of no phrase: every prefix lost
        pieces = self.pieces[state.sent]  # [N, P*L]
        rows = torch.arange(n, device=log_probs.device)[:, None].expand(-1, width).reshape(-1)
        pos, met = self.step(state.sent[rows], state.pos[rows], state.met[rows], pieces.reshape(-1))
        piece_ok = (self.need(state.sent[rows], pos, met) <= room[rows]).view(n, width)
        values = log_probs.gather(1, pieces)
        log_probs = log_probs.masked_fill(~other_ok[:, None], NEG_INF)
        log_probs.scatter_(1, pieces, values.masked_fill(~piece_ok, NEG_INF))
        log_probs[:, EOS] = eos.masked_fill(need > 0, NEG_INF)
        return log_probs

    def rank_candidates(
        self, state: LexicalState, beam_scores: Tensor, log_probs: Tensor, top: tuple[Tensor, Tensor, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Dynamic beam allocation. beam_scores [B, K], log_probs [N, V] (masked), top: beam search's top 2K
        candidates (scores, beams, tokens [B, 2K]) -> the candidates scores, beams, tokens [B, C] in the order the
        beam takes them (beam search finishes EOS among the first K and keeps the first K others)."""
        if self.n_phrases == 0:
            return top
        b, k = beam_scores.shape
        advancing = self.table[state.sent].gather(2, state.pos[:, :, None]).squeeze(2)  # [N, P] each next piece
        own = torch.cat([advancing, log_probs.argmax(1, keepdim=True)], dim=1)  # [N, P+1]
        own_scores = log_probs.gather(1, own) + beam_scores.reshape(-1, 1)
        own_scores[:, : self.n_phrases].masked_fill_(state.met, NEG_INF)  # a met phrase advances nothing
        width = own.shape[1]
        own_beams = torch.arange(k, device=own.device)[None, :, None].expand(b, k, width).reshape(b, -1)
        scores = torch.cat([top[0], own_scores.view(b, -1)], dim=1)  # [B, C]
        beams = torch.cat([top[1], own_beams], dim=1)
        tokens = torch.cat([top[2], own.view(b, -1)], dim=1)
        scores = without_duplicates(scores, beams * log_probs.shape[1] + tokens)
        rows = (torch.arange(b, device=beams.device)[:, None] * k + beams).view(-1)  # [B*C]
        pos, met = self.step(state.sent[rows], state.pos[rows], state.met[rows], tokens.view(-1))
        bank = (self.totals[state.sent[rows]] - self.need(state.sent[rows], pos, met)).view(b, -1)
        order = allocation_order(scores, bank, self.max_total)
        # An EOS candidate (all phrases met) that plain beam search would finish, among the K best by score,
        # finishes too: it leaves the beam, so moving it first changes none of the candidates that stay.
        by_score = scores.argsort(dim=1, descending=True, stable=True).argsort(dim=1)  # [B, C] each one's rank
        finishing = (tokens == EOS) & (by_score < k)
        place = torch.arange(order.shape[1], device=order.device).expand_as(order)
        finishing = finishing.gather(1, order) | (place < k) & (tokens.gather(1, order) == EOS)
        order = order.gather(1, (~finishing).to(torch.uint8).argsort(dim=1, stable=True))
        return scores.gather(1, order), beams.gather(1, order), tokens.gather(1, order)


def without_duplicates(scores: Tensor, keys: Tensor) -> Tensor:
    """scores [B, C] with all but the best-scoring of the candidates of equal key [B, C] set to -inf (a copy may
    score -inf: a met phrase's next piece is masked so, and the same piece may advance an unmet phrase)."""
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    sorted_keys, within = keys.gather(1, by_score).sort(dim=1, stable=True)  # each key's best copy first
    index = by_score.gather(1, within)
    repeat = torch.zeros_like(sorted_keys, dtype=torch.bool)
    repeat[:, 1:] = sorted_keys[:, 1:] == sorted_keys[:, :-1]
    return scores.masked_fill(torch.zeros_like(repeat).scatter(1, index, repeat), NEG_INF)


def allocation_order(scores: Tensor, bank: Tensor, max_bank: int) -> Tensor:
    """[B, C] the candidates' order: round-robin over the banks (constraint pieces met [B, C]), the bank with
    most met first in each round, each bank's candidates best first; candidates scoring -inf last."""
    bank = bank.masked_fill(~torch.isfinite(scores), -1)
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    by_bank = bank.gather(1, by_score).argsort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, by_bank)  # [B, C] by bank, then score
    sorted_bank = bank.gather(1, order)
    place = torch.arange(order.shape[1], device=order.device).expand_as(order)
    starts = torch.ones_like(sorted_bank, dtype=torch.bool)
    starts[:, 1:] = sorted_bank[:, 1:] != sorted_bank[:, :-1]
    first = torch.where(starts, place, 0).cummax(dim=1).values  # each bank's first place
    key = (place - first) * (max_bank + 2) + (max_bank - sorted_bank)
    key = key.masked_fill(sorted_bank < 0, order.shape[1] * (max_bank + 2) * 2)
    return order.gather(1, key.argsort(dim=1, stable=True))


def borders(table: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """[B, P, L, L] bool: borders[b, p, pos, m] when the phrase's first m pieces end its first pos pieces (m <= pos
    < its length), i.e. a match of length m + 1 may follow a match of length pos. The borders of a prefix are it
    and the chain of its KMP failure links: O(L) each."""
    b, p, length = table.shape
    out = np.zeros((b, p, length, length), dtype=bool)
    for i in range(b):
        for q in range(p):
            fail = failure_links(table[i, q, : lens[i, q]].tolist())
            for pos in range(lens[i, q]):
                m = pos
                out[i, q, pos, m] = True
                while m:
                    m = fail[m]
                    out[i, q, pos, m] = True
    return out


def failure_links(phrase: list[int]) -> list[int]:
    """fail[m] (1 <= m <= len): the length of the longest proper prefix of phrase[:m] that also ends it."""
    fail = [0] * (len(phrase) + 1)
    for m in range(2, len(phrase) + 1):
        f = fail[m - 1]
        while f and phrase[f] != phrase[m - 1]:
            f = fail[f]
        fail[m] = f + 1 if phrase[f] == phrase[m - 1] else 0
    return fail


@dataclass
class LexicalConstraints:
    """The ConstraintSource (search/constraint.py) of lexically constrained translation: `phrases[i]` are the
    phrases (piece ids) of the i-th source given to `translate`."""

    phrases: Sequence[Phrases]

    def for_batch(self, src: Tensor, src_lens: Tensor, ids: np.ndarray) -> tuple[LexicalConstraint, Tensor]:
        return LexicalConstraint([self.phrases[i] for i in ids], src.device), torch.zeros(len(ids), dtype=torch.long)


def encode_phrases(vocab: Vocab, lines: Sequence[Sequence[str]], where: Sequence[str]) -> list[list[list[int]]]:
    """Each line's phrases (raw text) as piece ids, each encoded on its own; duplicates and phrases inside another
    of the line dropped (met wherever that one is). DataError naming `where[i]` for an empty phrase or one with
    characters the vocabulary lacks (an unknown piece would meet it, not its text)."""
    flat = [phrase for line in lines for phrase in line]
    encoded = iter(vocab.encode(flat)) if flat else iter([])
    out = []
    for line, name in zip(lines, where):
        ids: list[list[int]] = []
        for n, phrase in enumerate(line, start=1):
            pieces = next(encoded)
            if not phrase.strip():
                raise DataError(f"{name}: constraint {n} is empty; give tab-separated phrases, or an empty line")
            if UNK in pieces:
                raise DataError(f"{name}: constraint {n} ({phrase!r}) has characters the model's vocabulary lacks")
            if pieces not in ids:
                ids.append(pieces)
        out.append([p for p in ids if not any(len(q) > len(p) and contains(q, p) for q in ids)])
    return out


def contains(tokens: Sequence[int], phrase: Sequence[int]) -> bool:
    """Whether `phrase` occurs contiguously in `tokens`."""
    n = len(phrase)
    return any(list(tokens[i : i + n]) == list(phrase) for i in range(len(tokens) - n + 1))


def checked_phrases(
    vocab: Vocab,
    lines: Sequence[Sequence[str]],
    src_lens: Sequence[int],
    search: SearchConfig,
    max_positions: int,
    where: Sequence[str],
) -> list[list[list[int]]]:
    """Each line's phrases encoded (`encode_phrases`) and checked to fit the output of its source of src_lens[i]
    pieces (`check_fits`; a source longer than the model's positions counted as the search cuts it): what
    generate's --constraints-file, serve's "constraints" and the Python API share (search/rules.py)."""
    phrases = encode_phrases(vocab, lines, where)
    check_fits(phrases, [min(n, max_positions - 1) for n in src_lens], search, max_positions, where)
    if n := search.no_repeat_ngram_size:
        for sentence, name in zip(phrases, where):
            if any(repeated_ngram(list(phrase), n) is not None for phrase in sentence):
                raise DataError(
                    f"{name}: a constraint repeats an n-gram of {n} pieces, which --no-repeat-ngram-size {n} "
                    "forbids; shorten it or raise N"
                )
    return phrases


def check_fits(
    phrases: Sequence[Phrases], src_lens: Sequence[int], search: SearchConfig, max_positions: int, where: Sequence[str]
) -> None:
    """Refuse (DataError naming `where[i]`) a sentence whose phrases need more pieces than its longest output holds (a *
    |x| + b within the model's positions), or an empty source with phrases (its output is empty)."""
    limits = max_lengths(torch.tensor(list(src_lens), dtype=torch.long), search, max_positions).tolist()
    for sentence, n, limit, name in zip(phrases, src_lens, limits, where):
        need = sum(len(p) for p in sentence)
        if need and n == 0:
            raise DataError(f"{name}: the input line is empty, so its output is; drop its constraints")
        if need > limit:
            fix = (
                f"the model's {max_positions} positions allow no more; shorten them"
                if limit == max_positions - 1
                else "shorten them or raise --max-len-a/--max-len-b (max_len_a/max_len_b)"
            )
            raise DataError(f"{name}: the constraints take {need} pieces, but this output may have {limit}; {fix}")


def check_with_prefixes(
    phrases: Sequence[Phrases],
    prefixes: Sequence[Sequence[int] | np.ndarray],
    src_lens: Sequence[int],
    search: SearchConfig,
    max_positions: int,
    where: Sequence[str],
) -> None:
    """Refuse (DataError naming `where[i]`) a sentence whose prefix leaves its phrases too few positions: after each
    piece of the prefix, the pieces still needed (`pieces_needed`, as `LexicalConstraint.mask` counts them) must fit."""
    limits = max_lengths(torch.tensor([min(n, max_positions - 1) for n in src_lens]), search, max_positions)
    for sentence, prefix, limit, name in zip(phrases, prefixes, limits.tolist(), where):
        for t in range(1, len(prefix) + 1 if sentence else 0):
            if t + (need := pieces_needed(sentence, list(prefix[:t]))) > limit:
                raise DataError(
                    f"{name}: the prefix's first {t} pieces and the {need} the constraints then need make "
                    f"{t + need}, but this output may have {limit}; shorten them or raise --max-len-a/--max-len-b "
                    "(max_len_a/max_len_b)"
                )


def pieces_needed(phrases: Phrases, written: list[int]) -> int:
    """`LexicalConstraint.need` on the host, for one output so far: the unmet phrases' total length less the
    longest of their prefixes that ends `written`."""
    unmet = [list(p) for p in phrases if not contains(written, p)]
    matched = [max((j for j in range(len(p)) if j == 0 or written[-j:] == p[:j]), default=0) for p in unmet]
    return sum(map(len, unmet)) - max(matched, default=0)
