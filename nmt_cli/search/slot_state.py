"""The beam search's state over fixed slots, all on the device in buffers of fixed shapes, and the whole search step
over it (`search_step`): the decoder step, the candidates, the finished and the surviving hypotheses and the count
of sentences still searching, one captured graph with CUDA graphs (search/graphs.py): the host replays it and reads
one number a step.

It is beam.py's search (`constrain`, `top_candidates`, `finish`, `survive`) with nothing that changes a shape or
depends on the step's number on the host: each row's hypothesis is a row of `tokens` [N, L], step t written at
position t; the finished hypotheses are held by slot (`fin`) and copied into the call's (`flush`) when a batch
moves, tells sentences early, or ends; the step number is the cache's `step` tensor, a finished sentence's rows
parked at 0; the minimum length, the unknown-piece penalty and the length penalties (a table by length) are tensors
loaded with the batch, so batches of other settings replay the same graph.

Shapes: B sentences in the slots, K beams, N = B*K rows (row = slot * K + beam), L the bucket's positions (at least
the longest output + 1), V vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import BOS, EOS, PAD, UNK
from nmt_cli.model.slots import rows_of
from nmt_cli.search.beam import NEG_INF, Finished, length_penalty, per_beam, top_candidates
from nmt_cli.search.beam import start as empty_search


@dataclass
class SlotState:
    tokens: Tensor  # [N, L] long: each row's hypothesis, its token of step t at position t
    token_scores: Tensor  # [N, L] float: their log-probs
    scores: Tensor  # [B, K] float: each hypothesis' summed log-prob; -inf for a beam not searching
    sent_ids: Tensor  # [B] long: the call's sentence in each slot
    max_len: Tensor  # [N] long: each row's longest output (EOS forced there)
    prev: Tensor  # [N] long: each row's last token, the next step's input
    rows: Tensor  # [N] long: the row each row continues at the next step (the decoder cache's pending reorder)
    done: Tensor  # [B] bool: the slot's sentence has K finished hypotheses
    n_live: Tensor  # [1] long: slots whose sentence is still searching (the host's one read a step)
    min_len: Tensor  # [1] long
    unkpen: Tensor  # [1] float
    penalties: Tensor  # [L + 1] float: the length penalty of each length (EOS counted)
    fin: Finished  # by slot: tokens and step_scores [B, K + 1, L], lengths, scores [B, K + 1], count [B]
    n_pieces: int | None = None  # the embedding table's rows beyond the vocabulary's pieces are never chosen

    @classmethod
    def start(
        cls, max_len: Tensor, b0: int, k: int, n_positions: int, cfg: SearchConfig, n_pieces: int | None
    ) -> SlotState:
        """The state of a new batch: B sentences (max_len [B]), the first b0 of the call and then copies searched
        by none (a bucket's filling: done from the start, their K finished slots counted as full)."""
        b, device = max_len.shape[0], max_len.device
        n, length = b * k, n_positions
        empty, fin = empty_search(b, k, length, device)  # beam.py's start: its scores and finished slots
        fin.count[b0:] = k
        penalties = [1.0] + [length_penalty(i, cfg.lenpen, cfg.lenpen_style) for i in range(1, length + 1)]
        return cls(
            torch.zeros(n, length, dtype=torch.long, device=device),
            torch.zeros(n, length, device=device),
            empty.scores,
            torch.arange(b, device=device),
            per_beam(max_len, k).contiguous(),  # its own memory (one sentence: a stride-0 view)
            torch.full((n,), BOS, dtype=torch.long, device=device),
            torch.arange(n, device=device),
            fin.count >= k,
            torch.tensor([b0], device=device),
            torch.tensor([cfg.min_len], device=device),
            torch.tensor([float(cfg.unkpen)], device=device),
            torch.tensor(penalties, dtype=torch.float32, device=device),
            fin,
            n_pieces,
        )

    def tensors(self) -> list[Tensor]:
        """Every buffer, the finished ones' included, in a fixed order (`load`, `snapshot`)."""
        own = [getattr(self, f.name) for f in fields(self) if f.name not in ("fin", "n_pieces")]
        return [*own, *(getattr(self.fin, f.name) for f in fields(self.fin))]

    def load(self, other: SlotState) -> None:
        """Take `other`'s batch into these buffers (the same shapes: the same bucket), which keep their addresses."""
        for mine, theirs in zip(self.tensors(), other.tensors()):
            assert mine.shape == theirs.shape, "a batch's state is loaded only into a state of its own shapes"
            mine.copy_(theirs)

    def snapshot(self) -> list[Tensor]:
        return [t.clone() for t in self.tensors()]

    def restore(self, saved: list[Tensor]) -> None:
        for mine, kept in zip(self.tensors(), saved):
            mine.copy_(kept)

    def select(self, keep: Tensor) -> SlotState:
        """The state of the slots `keep` [B'] alone, in new buffers, their hypotheses as they stand (the decoder
        cache's pending reorder, `rows`, is the caller's to apply: the new state's rows are its own)."""
        k = self.scores.shape[1]
        rows = rows_of(keep, k)
        return SlotState(
            self.tokens[rows],
            self.token_scores[rows],
            self.scores[keep],
            self.sent_ids[keep],
            self.max_len[rows],
            self.prev[rows],
            torch.arange(rows.shape[0], device=keep.device),
            self.done[keep],
            self.n_live.clone(),
            self.min_len.clone(),
            self.unkpen.clone(),
            self.penalties.clone(),
            Finished(*(getattr(self.fin, f.name)[keep] for f in fields(self.fin))),
            self.n_pieces,
        )

    def stop(self, slots: Tensor) -> None:
        """Stop searching the sentences in the slots `slots` [A] (no longer wanted): done, their beams masked, their
        finished slots counted full (each step counts `done` anew from them: a stopped sentence must stay done, or
        its rows would step on, past the buffers)."""
        self.done.index_fill_(0, slots, True)
        self.scores.index_fill_(0, slots, NEG_INF)
        self.fin.count.index_fill_(0, slots, self.scores.shape[1])

    def flush(self, fin: Finished) -> None:
        """Copy the slots' finished hypotheses into the call's `fin` (indexed by the call's sentences)."""
        for f in fields(fin):
            getattr(fin, f.name).index_copy_(0, self.sent_ids, getattr(self.fin, f.name))


def search_step(model: Any, cache: Any, state: SlotState, window: int) -> None:
    """One step of the beam search over the slots (beam.py's step, every shape fixed): the decoder step at the
    cache's position t (reading `window` positions), then the candidates, the finished and the surviving
    hypotheses, `done` and `n_live`. model: a SlotModel (search/graphs.py)."""
    step = cache.step.clone()  # [N] each row's position, the one this step writes
    log_probs = model.decode_slots(state.prev, state.rows, cache, window)  # [N, V]
    constrain(log_probs, step, state)
    b, k = state.scores.shape
    scores, beams, tokens = top_candidates(state.scores, log_probs)  # [B, 2K] candidates, best first (by blocks on CPU)
    finish(state, scores, beams, tokens, log_probs, step)
    survive(state, scores, beams, tokens, log_probs, step)
    torch.ge(state.fin.count, k, out=state.done)
    state.done |= (step >= state.max_len).view(b, k).all(1)  # past its longest output, done with what it found
    torch.sum(state.done.logical_not(), 0, keepdim=True, out=state.n_live)
    state.scores.masked_fill_(state.done[:, None], NEG_INF)  # a finished sentence's rows stay, masked
    cache.park(per_beam(state.done, k))  # at position 0, never past the buffers


def constrain(log_probs: Tensor, step: Tensor, state: SlotState) -> None:
    """beam.py's `constrain` with the step a tensor: never PAD or BOS nor rows past the pieces, the unknown piece's
    penalty, no EOS before the minimum length, only EOS at a row's maximum length."""
    log_probs[:, PAD] = NEG_INF
    log_probs[:, BOS] = NEG_INF
    if state.n_pieces is not None:
        log_probs[:, state.n_pieces :] = NEG_INF
    log_probs[:, UNK] -= state.unkpen
    eos = log_probs[:, EOS].clone()
    log_probs[:, EOS] = torch.where(step < state.min_len, NEG_INF, log_probs[:, EOS])
    at_max = state.max_len <= step  # [N]
    log_probs.masked_fill_(at_max[:, None], NEG_INF)
    log_probs[:, EOS] = torch.where(at_max, eos, log_probs[:, EOS])


def finish(state: SlotState, scores: Tensor, beams: Tensor, tokens: Tensor, log_probs: Tensor, step: Tensor) -> None:
    """beam.py's `finish` into the slots' own finished hypotheses: EOS candidates within the top K, best first, while
    the slot has room; the others written to the spare slot K, never read."""
    fin = state.fin
    b, k = state.scores.shape
    is_final = (tokens[:, :k] == EOS) & torch.isfinite(scores[:, :k])  # [B, K]
    slot = fin.count[:, None] + is_final.long().cumsum(1) - 1
    write = is_final & (slot < k)
    dest = torch.where(write, slot, k)  # [B, K]
    sent = torch.arange(b, device=beams.device)[:, None].expand(b, k)
    src = sent * k + beams[:, :k]  # [B, K] the candidates' rows
    at = step.view(b, k)
    fin.tokens[sent, dest] = state.tokens[src]  # the whole row: past the step, what collect() never reads
    fin.tokens[sent, dest, at] = dest.new_full((), EOS)
    fin.step_scores[sent, dest] = state.token_scores[src]
    fin.step_scores[sent, dest, at] = log_probs[src, EOS]
    fin.lengths[sent, dest] = at + 1
    fin.scores[sent, dest] = scores[:, :k] / state.penalties[at + 1]
    fin.count.add_(write.long().sum(1))


def survive(state: SlotState, scores: Tensor, beams: Tensor, tokens: Tensor, log_probs: Tensor, step: Tensor) -> None:
    """beam.py's `survive` in place: the best K candidates not ending in EOS become the rows' hypotheses (each row's
    history copied from the row it continues), their tokens the next step's input and their rows the decoder
    cache's pending reorder."""
    b, k = state.scores.shape
    alive, pick = scores.masked_fill(tokens == EOS, NEG_INF).topk(k, dim=1)  # [B, K]
    new_token = tokens.gather(1, pick).view(-1)  # [N]
    rows = (torch.arange(b, device=beams.device)[:, None] * k + beams.gather(1, pick)).view(-1)  # [N]
    token_scores = log_probs[rows, new_token]  # [N]
    state.tokens.copy_(state.tokens.index_select(0, rows))
    state.tokens.scatter_(1, step[:, None], new_token[:, None])
    state.token_scores.copy_(state.token_scores.index_select(0, rows))
    state.token_scores.scatter_(1, step[:, None], token_scores[:, None])
    state.scores.copy_(alive)
    state.rows.copy_(rows)
    state.prev.copy_(new_token)
