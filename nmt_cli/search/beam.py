"""Batched beam search with incremental decoding.

Shapes: B0 sentences in the call, B sentences still searching (B <= B0; finished ones leave the
batch), K beam, V vocabulary, t tokens generated so far, L the longest allowed output + 1.

Each step scores all K*V extensions of every sentence's beams and takes the top 2K candidates: those ending in EOS
that rank within the top K finish (scored with the length penalty), the best K others stay alive. A sentence stops
once it has K finished hypotheses, or at its maximum length a * |x| + b (|x| source pieces), where EOS is forced:
fairseq's rule, with K = 1 exactly greedy search.

The host waits for the device once per step (how many sentences are done). An optional `constraint`
(search/constraint.py) masks log-probs before the top-k, follows the beams, and may choose and order the candidates
(`rank_candidates`); `still_wanted` (serve's requests that timed out or went away) is asked once a step, and a
sentence no longer wanted leaves the batch; `on_done` (serve) is told a sentence's results as it finishes.
`beam_steps` yields after each decoder step (serve's worker interleaves batches by step); `beam_search` runs it
to its end."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import BOS, EOS, PAD, UNK
from nmt_cli.runtime import to_device_async
from nmt_cli.search.constraint import Followed
from nmt_cli.search.hypothesis import Hypothesis, nothing_found
from nmt_cli.search.searchable import SearchEncoderOut, SearchModel
from nmt_cli.steps import Steps, to_the_end  # a search is stepped work (serve's worker interleaves)

NEG_INF = float("-inf")

# Asked once a step: for each sentence of the call, in order, whether its result is still wanted (host-side,
# e.g. a request's Future not yet done). The hypotheses of a sentence no longer wanted are to be discarded.
StillWanted = Callable[[], Sequence[bool]]


# Told a sentence of the call (its index) and its nbest hypotheses at the step it finishes (and returned at the end)
OnDone = Callable[[int, list[Hypothesis]], None]


@dataclass
class BeamState:
    tokens: Tensor  # [B, K, t] alive hypotheses (without BOS)
    scores: Tensor  # [B, K] summed log-probs of the alive hypotheses
    step_scores: Tensor  # [B, K, t] log-prob of each alive token
    sent_ids: Tensor  # [B] index of each active sentence in the call


@dataclass
class Finished:
    """Finished hypotheses of every sentence in the call, filled best-candidate first."""

    tokens: Tensor  # [B0, K + 1, L] EOS included, PAD after
    step_scores: Tensor  # [B0, K + 1, L]
    lengths: Tensor  # [B0, K + 1] tokens including EOS
    scores: Tensor  # [B0, K + 1] length-normalised score, -inf for an empty slot
    count: Tensor  # [B0] filled slots
    # Slot K is a spare that candidates which do not finish are written to (so that `finish` needs no
    # host-side selection); it is never read.


def length_penalty(length: int, alpha: float, style: str) -> float:
    """GNMT: ((5 + |Y|) / 6)^alpha (the paper's); fairseq: |Y|^alpha. |Y| counts EOS."""
    return ((5.0 + length) / 6.0) ** alpha if style == "gnmt" else float(length) ** alpha


def max_lengths(src_lens: Tensor, cfg: SearchConfig, max_positions: int) -> Tensor:
    """[B] the longest output (without EOS) allowed for each sentence: a * |x| + b, within the model's positions.

    a and b are first capped at max_positions (exact: a >= 0, b >= 0 and |x| is 0 or at least 1), so that absurd
    values (--max-len-b 10**30) reach the model's limit instead of overflowing the int64 conversion."""
    a, b = min(cfg.max_len_a, max_positions), min(cfg.max_len_b, max_positions)
    return (src_lens.double() * a + b).long().clamp(min=1, max=max_positions - 1)


def length_limits(
    src_lens: Tensor, cfg: SearchConfig, max_positions: int, device: torch.device
) -> tuple[Tensor, int, int]:
    """[B0] each sentence's longest output (`max_lengths`) on `device`, the steps of the longest (EOS included),
    and the first step at which a row may reach its maximum: known on the host (translate's lengths are there)."""
    host = max_lengths(src_lens.cpu(), cfg, max_positions).numpy()
    return torch.from_numpy(host).to(device), int(host.max()) + 1, int(host.min())


def constrain(
    log_probs: Tensor, step: int, max_len: Tensor, cfg: SearchConfig, n_pieces: int | None, may_reach_max: bool
) -> Tensor:
    """Never PAD or BOS, nor the embedding table's padding rows (ids >= n_pieces, no sentencepiece piece);
    no EOS before min_len; only EOS at max_len, min_len or not (max_len is the hard limit, as in greedy
    search); unk penalty. log_probs: [N, V], max_len: [N].

    may_reach_max: False when the caller knows no row is at its maximum length yet (saves a pass over log_probs).
    """
    log_probs[:, PAD] = NEG_INF
    log_probs[:, BOS] = NEG_INF
    if n_pieces is not None:
        log_probs[:, n_pieces:] = NEG_INF
    if cfg.unkpen:
        log_probs[:, UNK] -= cfg.unkpen
    eos_column = log_probs[:, EOS].clone() if may_reach_max else None
    if step < cfg.min_len:
        log_probs[:, EOS] = NEG_INF
    if eos_column is not None:
        at_max = max_len <= step
        log_probs.masked_fill_(at_max[:, None], NEG_INF)
        log_probs[:, EOS] = torch.where(at_max, eos_column, log_probs[:, EOS])
    return log_probs


def top_candidates(beam_scores: Tensor, log_probs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The best 2K extensions of each sentence: the top 2K of its K*V totals, beam score + log-prob.
    beam_scores: [B, K] (a search state's `scores`), log_probs: [B*K, V] -> scores, beams, tokens: [B, 2K], best first.

    On CPU by blocks of `candidate_block(V)` columns: each of a sentence's 2K best totals lies in one of the 2K blocks
    whose best total (the block's maximum plus its beam's score) is highest, or in the last V % block columns, always
    kept; so two top-k calls on B rows over those. Elsewhere, and under 512 pieces, the top 2K of all K*V totals.
    Equal totals may come in another order than one top-k over all K*V would give."""
    b, k = beam_scores.shape
    rows, v = log_probs.shape
    n, block = min(2 * k, k * v), candidate_block(v)
    row_scores = beam_scores.view(rows, 1)
    if log_probs.device.type != "cpu" or block < 4:
        scores, flat = (log_probs + row_scores).view(b, k * v).topk(n, dim=1)
        return scores, flat // v, flat % v
    n_blocks = v // block
    main = n_blocks * block
    maxima = log_probs[:, :main].view(rows, n_blocks, block).amax(-1).add_(row_scores)
    best = maxima.view(b, k * n_blocks).topk(n, dim=1).indices  # [B, n]: beam * blocks + block
    beam = best // n_blocks
    first = beam * v + (best % n_blocks) * block  # [B, n] each block's first entry in its sentence's K*V
    index = (first[:, :, None] + torch.arange(block, device=best.device)).view(b, n * block)
    totals = log_probs.view(b, k * v).gather(1, index).view(b, n, block)
    totals = totals.add_(beam_scores.gather(1, beam)[:, :, None]).view(b, n * block)
    if main < v:  # the ragged last columns of every beam
        tail = torch.arange(0, k * v, v, device=best.device)[:, None] + torch.arange(main, v, device=best.device)
        index = torch.cat([index, tail.view(1, -1).expand(b, -1)], dim=1)
        totals = torch.cat([totals, (log_probs[:, main:] + row_scores).view(b, -1)], dim=1)
    scores, pick = totals.topk(n, dim=1)
    flat = index.gather(1, pick)  # [B, n] into the sentence's K*V: beam * V + token
    return scores, flat // v, flat % v


def candidate_block(v: int) -> int:
    """top_candidates' block width for a V-piece vocabulary: the largest power of two up to V / 128. PyTorch's CPU
    top-k switches from a partial sort to a slower nth_element below n = 64k, and block maxima are a slow reduction
    unless the block is a power of two: with at least 128 blocks per beam the first top-k stays on the partial sort
    (`benchmarks/profile_generate.py`, `ab_generate.py`)."""
    return 1 << max((v // 128).bit_length() - 1, 0)


def finish(
    state: BeamState,
    fin: Finished,
    scores: Tensor,
    beams: Tensor,
    tokens: Tensor,
    log_probs: Tensor,
    step: int,
    cfg: SearchConfig,
) -> None:
    """Move EOS candidates ranked within the top K into the finished slots, best first, while slots remain.

    All K top candidates are written, those that do not finish into the spare slot K: no host sync. The step's
    numbers are written as device tensors: a Python number written through tensor indices becomes a CPU
    tensor that PyTorch copies to the device with a blocking copy (two host syncs a step on CUDA).
    """
    b, k = state.scores.shape
    is_final = (tokens[:, :k] == EOS) & torch.isfinite(scores[:, :k])  # [B, K]
    slot = fin.count[state.sent_ids, None] + is_final.long().cumsum(1) - 1
    write = is_final & (slot < k)
    dest = torch.where(write, slot, k)  # [B, K]
    sent, src_beam = state.sent_ids[:, None].expand(b, k), beams[:, :k]
    rows = torch.arange(b, device=beams.device)[:, None]
    fin.tokens[sent, dest, :step] = state.tokens[rows, src_beam]
    fin.tokens[sent, dest, step] = dest.new_full((), EOS)
    fin.step_scores[sent, dest, :step] = state.step_scores[rows, src_beam]
    fin.step_scores[sent, dest, step] = log_probs.view(b, k, -1)[rows, src_beam, EOS]
    fin.lengths[sent, dest] = dest.new_full((), step + 1)
    fin.scores[sent, dest] = scores[:, :k] / length_penalty(step + 1, cfg.lenpen, cfg.lenpen_style)
    fin.count.index_add_(0, state.sent_ids, write.long().sum(1))


def survive(
    state: BeamState, scores: Tensor, beams: Tensor, tokens: Tensor, log_probs: Tensor, in_order: bool = False
) -> tuple[BeamState, Tensor]:
    """Keep the best K candidates that do not end in EOS (in_order: the first K, the candidates being in the order
    a constraint's `rank_candidates` gave). Returns the new state and the source rows [B*K]."""
    b, k = state.scores.shape
    if in_order:
        place = -torch.arange(scores.shape[1], dtype=torch.float, device=scores.device).expand_as(scores)
        pick = place.masked_fill(tokens == EOS, NEG_INF).topk(k, dim=1).indices  # [B, K]
        alive_scores = scores.gather(1, pick)
    else:
        alive_scores, pick = scores.masked_fill(tokens == EOS, NEG_INF).topk(k, dim=1)  # [B, K]
    src_beam, new_token = beams.gather(1, pick), tokens.gather(1, pick)
    rows = (torch.arange(b, device=beams.device)[:, None] * k + src_beam).view(-1)  # [B*K]
    token_scores = log_probs[rows, new_token.view(-1)].view(b, k)
    new = BeamState(
        torch.cat([state.tokens.view(b * k, -1)[rows].view(b, k, -1), new_token[:, :, None]], dim=2),
        alive_scores,
        torch.cat([state.step_scores.view(b * k, -1)[rows].view(b, k, -1), token_scores[:, :, None]], 2),
        state.sent_ids,
    )
    return new, rows


def per_beam(x: Tensor, k: int) -> Tensor:
    """[B] -> [B*K], each entry K times (x.repeat_interleave(k) without its host sync on CUDA)."""
    return x[:, None].expand(-1, k).reshape(-1)


def keep_sentences(state: BeamState, keep: Tensor) -> BeamState:
    return BeamState(state.tokens[keep], state.scores[keep], state.step_scores[keep], state.sent_ids[keep])


def collect(fin: Finished, nbest: int, sentences: Tensor | None = None) -> list[list[Hypothesis]]:
    """Each sentence's (or those `sentences`' [n]) `nbest` finished hypotheses, best first (copied to the host
    once: four copies, then read there with NumPy). Rules (constraints) may have finished fewer: those, or
    `nothing_found()` where none."""
    pick = slice(None) if sentences is None else sentences
    scores, tokens = fin.scores[pick].cpu().numpy(), fin.tokens[pick].cpu().numpy()
    step_scores, lengths = fin.step_scores[pick].cpu().numpy(), fin.lengths[pick].cpu().numpy()
    order = np.argsort(-scores[:, :-1], axis=1, kind="stable")[:, :nbest]  # without the spare slot
    results = []
    for s in range(scores.shape[0]):
        found = [j for j in order[s] if np.isfinite(scores[s, j])]  # rules may finish fewer than nbest, or none
        hyps = [
            Hypothesis(tokens[s, j, : n - 1].tolist(), float(scores[s, j]), step_scores[s, j, :n].tolist())
            for j, n in ((j, int(lengths[s, j])) for j in found)
        ]
        results.append(hyps or [nothing_found()])
    return results


class Unwanted:
    """The sentences of a call no longer wanted (`still_wanted`'s answers), on the host and on the device; copied
    to the device only when the answer changes (host booleans: no wait for the device)."""

    def __init__(self, still_wanted: StillWanted, device: torch.device) -> None:
        self.still_wanted, self.device = still_wanted, device
        self.host: list[bool] = []
        self.on_device: Tensor | None = None  # [B0] bool; None while every sentence is wanted

    def update(self) -> Tensor | None:
        """Ask again; the [B0] mask of sentences no longer wanted, or None while every one is."""
        gone = [not w for w in self.still_wanted()]
        if any(gone) and gone != self.host:
            self.host, self.on_device = gone, to_device_async(torch.tensor(gone), self.device)  # waits for no kernel
        return self.on_device


def tell(on_done: OnDone, fin: Finished, nbest: int, ids: Tensor) -> None:
    """Tell `on_done` the results of the sentences `ids` [n] of the call."""
    for i, hyps in zip(ids.tolist(), collect(fin, nbest, ids)):
        on_done(i, hyps)


def start(b0: int, k: int, n_steps: int, device: torch.device) -> tuple[BeamState, Finished]:
    """Empty hypotheses; only beam 0 of each sentence is live at first (the others score -inf)."""
    scores = torch.full((b0, k), NEG_INF, device=device)
    scores[:, 0] = 0.0
    state = BeamState(
        torch.zeros(b0, k, 0, dtype=torch.long, device=device),
        scores,
        torch.zeros(b0, k, 0, device=device),
        torch.arange(b0, device=device),
    )
    fin = Finished(
        torch.full((b0, k + 1, n_steps), PAD, dtype=torch.long, device=device),
        torch.zeros(b0, k + 1, n_steps, device=device),
        torch.ones(b0, k + 1, dtype=torch.long, device=device),
        torch.full((b0, k + 1), NEG_INF, device=device),
        torch.zeros(b0, dtype=torch.long, device=device),
    )
    return state, fin


@torch.inference_mode()
def beam_steps(
    model: SearchModel,
    enc: SearchEncoderOut,
    src_lens: Tensor,
    cfg: SearchConfig,
    n_pieces: int | None = None,
    *,
    rules: Followed | None = None,
    still_wanted: StillWanted | None = None,
    on_done: OnDone | None = None,
) -> Steps[list[list[Hypothesis]]]:
    """Translate the B0 sentences `enc` of the model (a Transformer or an Ensemble; src_lens [B0] without EOS), one
    decoder step per resumption, never writing ids from `n_pieces` on (embedding padding); each sentence's
    `cfg.nbest` hypotheses, best first. `rules`: the constraint the beams follow (search/constraint.py) and
    n_leaves [B0]. `still_wanted`, `on_done`: see StillWanted and OnDone (not told of the last step's sentences)."""
    k, device, b0 = cfg.beam, enc.memory.device, enc.memory.shape[0]
    max_len, n_steps, first_max = length_limits(src_lens, cfg, model.max_positions, device)
    (state, fin), row_max_len = start(b0, k, n_steps, device), per_beam(max_len, k)  # row_max_len: [B*K]
    cache = model.init_cache(enc, 1)  # all beams start equal: step 0 runs once per sentence
    prev = torch.full((b0,), BOS, dtype=torch.long, device=device)
    constraint = None if rules is None else rules[0]
    constraint_state: Any = None if rules is None else rules[0].start(per_beam(rules[1].to(device), k))
    rank = None if constraint is None else constraint.rank_candidates
    unwanted = None if still_wanted is None else Unwanted(still_wanted, device)
    for step in range(n_steps):
        log_probs, cache = model.decode_step(prev, cache)  # [B*K, V]
        if step == 0:
            to_beams = per_beam(torch.arange(b0, device=device), k)
            log_probs, cache = log_probs[to_beams], cache.select_rows(to_beams)
        log_probs = constrain(log_probs, step, row_max_len, cfg, n_pieces, may_reach_max=step >= first_max)
        if constraint is not None:
            log_probs = constraint.mask(log_probs, constraint_state, step, row_max_len)
        top = top_candidates(state.scores, log_probs)
        if rank is not None:  # the constraint's own choice and order of candidates (search/lexical.py)
            top = rank(constraint_state, state.scores, log_probs, top)
        finish(state, fin, *top, log_probs, step, cfg)
        state, rows = survive(state, *top, log_probs, in_order=rank is not None)
        done = finished = fin.count[state.sent_ids] >= k  # [B]
        if unwanted is not None and (gone := unwanted.update()) is not None:
            done = done | gone[state.sent_ids]  # they leave with the finished ones, counted in the same host sync
        b, n_done = done.shape[0], int(done.sum())  # the step's one host synchronisation
        if n_done == b:
            break
        if n_done and on_done is not None:
            tell(on_done, fin, cfg.nbest, state.sent_ids[finished])
        if n_done:  # finished sentences leave the batch; keep: the others, in order
            keep = torch.argsort(done.to(torch.uint8), stable=True)[: b - n_done]
            rows = rows.view(-1, k)[keep].view(-1)
            state = keep_sentences(state, keep)
            cache = cache.select_sentences(keep, rows)
            row_max_len = per_beam(max_len[state.sent_ids], k)
        else:
            cache = cache.select_rows(rows)
        prev = state.tokens[:, :, -1].reshape(-1)
        if constraint is not None:
            constraint_state = constraint.advance(constraint_state.select(rows), prev)
        yield  # a step done: serve's worker may search another batch before the next
    return collect(fin, cfg.nbest)


beam_search = to_the_end(beam_steps)
