"""Greedy decoding and sampling (top-k, nucleus, temperature): one token per sentence per step.

Shapes: B sentences, V vocabulary. Greedy is the reference that beam search with K = 1 must match, so it
shares none of beam.py's code: its length limits, token masks and length penalty are written out here again,
plainly, one sentence at a time where that is clearer. A sentence no longer wanted (`still_wanted`, asked once
a step as beam search asks it) ends with EOS at that step, its hypothesis to be discarded.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import BOS, EOS, PAD, UNK
from nmt_cli.search.beam import StillWanted, Unwanted
from nmt_cli.search.constraint import Followed
from nmt_cli.search.hypothesis import Hypothesis, nothing_found
from nmt_cli.search.searchable import SearchEncoderOut, SearchModel
from nmt_cli.steps import Steps, to_the_end

NEG_INF = float("-inf")


def sample_from(log_probs: Tensor, cfg: SearchConfig, generator: torch.Generator | None) -> Tensor:
    """Draw one token per row from temperature-scaled, top-k / top-p truncated distributions. -> [B]"""
    logits = (log_probs - log_probs.amax(-1, keepdim=True)) / cfg.temperature  # a low temperature: no -inf / NaN
    if cfg.sampling_topk > 0:
        kth = logits.topk(min(cfg.sampling_topk, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if cfg.sampling_topp < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= cfg.sampling_topp  # keep the smallest prefix reaching p
        drop_sorted[:, 0] = False  # and the best token, whose own mass may round above a tiny p
        logits = logits.masked_fill(torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted), NEG_INF)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)


@torch.inference_mode()
def greedy_steps(
    model: SearchModel,
    enc: SearchEncoderOut,
    src_lens: Tensor,
    cfg: SearchConfig,
    generator: torch.Generator | None = None,
    n_pieces: int | None = None,
    *,
    rules: Followed | None = None,
    still_wanted: StillWanted | None = None,
) -> Steps[list[list[Hypothesis]]]:
    """Pick the most likely token each step (or sample one with cfg.sampling) until EOS or max length, one decoder
    step per resumption (`greedy_search` runs it to its end).

    Ids from `n_pieces` on (the embedding table's padding rows) are never chosen. Optional `rules`: a constraint
    (search/constraint.py) that masks the log-probs first, and n_leaves [B].
    """
    b, device = enc.memory.shape[0], enc.memory.device
    limits = [min(max(int(n * cfg.max_len_a + cfg.max_len_b), 1), model.max_positions - 1) for n in src_lens.tolist()]
    max_len = torch.tensor(limits, device=device)
    cache = model.init_cache(enc, 1)
    prev = torch.full((b,), BOS, dtype=torch.long, device=device)
    tokens, scores = [], []
    done = torch.zeros(b, dtype=torch.bool, device=device)
    constraint = None if rules is None else rules[0]
    constraint_state: Any = None if rules is None else rules[0].start(rules[1].to(device))
    unwanted = None if still_wanted is None else Unwanted(still_wanted, device)
    for step in range(max(limits) + 1):
        log_probs, cache = model.decode_step(prev, cache)
        log_probs = allowed_tokens(log_probs, step, max_len, cfg, n_pieces)
        if constraint is not None:
            log_probs = constraint.mask(log_probs, constraint_state, step, max_len)
        choice = sample_from(log_probs, cfg, generator) if cfg.sampling else log_probs.argmax(-1)
        if unwanted is not None and (gone := unwanted.update()) is not None:
            choice = choice.masked_fill(gone, EOS)  # ends them now, checked with the others' EOS below
        tokens.append(choice.masked_fill(done, PAD))
        scores.append(log_probs.gather(1, choice[:, None]).squeeze(1).masked_fill(done, 0.0))
        done = done | (choice == EOS)
        if bool(done.all()):
            break
        prev = choice
        if constraint is not None:
            constraint_state = constraint.advance(constraint_state, choice)
        yield  # a step done: serve's worker may search another batch before the next
    return to_hypotheses(torch.stack(tokens, 1), torch.stack(scores, 1), cfg)


def allowed_tokens(
    log_probs: Tensor, step: int, max_len: Tensor, cfg: SearchConfig, n_pieces: int | None = None
) -> Tensor:
    """Mask what may not come next: PAD, BOS and the embedding's padding rows (ids >= n_pieces) never,
    EOS before min_len, anything but EOS at max_len."""
    mask = torch.zeros_like(log_probs, dtype=torch.bool)
    mask[:, [PAD, BOS]] = True
    if n_pieces is not None:
        mask[:, n_pieces:] = True
    if step < cfg.min_len:
        mask[:, EOS] = True
    mask[max_len <= step] = True
    mask[max_len <= step, EOS] = False
    out = log_probs.masked_fill(mask, NEG_INF)
    if cfg.unkpen:
        out[:, UNK] -= cfg.unkpen
    return out


def to_hypotheses(tokens: Tensor, scores: Tensor, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """tokens, scores: [B, t] with EOS ending each row -> one Hypothesis per sentence (`nothing_found()` where a
    row's rules banned every token before its EOS)."""
    results = []
    for row_tokens, row_scores in zip(tokens.tolist(), scores.tolist()):
        n = row_tokens.index(EOS) + 1 if EOS in row_tokens else 0
        total = sum(row_scores[:n])
        if not n or not math.isfinite(total):  # its rules left it no token that ends within its maximum length
            results.append([nothing_found()])
            continue
        penalty = ((5 + n) / 6) ** cfg.lenpen if cfg.lenpen_style == "gnmt" else n**cfg.lenpen  # |Y| counts EOS
        results.append([Hypothesis(row_tokens[: n - 1], total / penalty, row_scores[:n])])
    return results


greedy_search = to_the_end(greedy_steps)
