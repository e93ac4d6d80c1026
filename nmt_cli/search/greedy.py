"""Greedy decoding and sampling (top-k, nucleus, temperature): one token per sentence per step.

Shapes: B sentences, V vocabulary. Greedy is the reference that beam search with K = 1 must match.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import BOS, EOS, PAD
from nmt_cli.model.transformer import EncoderOut, Transformer
from nmt_cli.search.beam import Hypothesis, constrain, length_penalty, max_lengths

NEG_INF = float("-inf")


def sample_from(log_probs: Tensor, cfg: SearchConfig, generator: torch.Generator | None) -> Tensor:
    """Draw one token per row from temperature-scaled, top-k / top-p truncated distributions. -> [B]"""
    logits = log_probs / cfg.temperature
    if cfg.sampling_topk > 0:
        kth = logits.topk(min(cfg.sampling_topk, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if cfg.sampling_topp < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= cfg.sampling_topp  # keep the smallest prefix reaching p
        logits = logits.masked_fill(torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted), NEG_INF)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)


@torch.inference_mode()
def greedy_search(model: Transformer, enc: EncoderOut, src_lens: Tensor, cfg: SearchConfig,
                  generator: torch.Generator | None = None, constraint: Any = None,
                  n_leaves: Tensor | None = None) -> list[list[Hypothesis]]:
    """Pick the most likely token each step (or sample one with cfg.sampling) until EOS or max length.

    An optional `constraint` (parsing/constraint.py) masks the log-probs first (n_leaves [B] per sentence).
    """
    b, device = enc.memory.shape[0], enc.memory.device
    max_len = max_lengths(src_lens, cfg, model.max_positions).to(device)
    cache = model.init_cache(enc, 1)
    prev = torch.full((b,), BOS, dtype=torch.long, device=device)
    tokens, scores = [], []
    done = torch.zeros(b, dtype=torch.bool, device=device)
    tree = constraint.start(n_leaves.to(device)) if constraint is not None else None
    for step in range(int(max_len.max()) + 1):
        log_probs, cache = model.decode_step(prev, cache)
        log_probs = constrain(log_probs, step, max_len, cfg)
        if constraint is not None:
            log_probs = constraint.mask(log_probs, tree, step, max_len)
        choice = sample_from(log_probs, cfg, generator) if cfg.sampling else log_probs.argmax(-1)
        tokens.append(choice.masked_fill(done, PAD))
        scores.append(log_probs.gather(1, choice[:, None]).squeeze(1).masked_fill(done, 0.0))
        done = done | (choice == EOS)
        if bool(done.all()):
            break
        prev = choice
        if constraint is not None:
            tree = constraint.advance(tree, choice)
    return to_hypotheses(torch.stack(tokens, 1), torch.stack(scores, 1), cfg)


def to_hypotheses(tokens: Tensor, scores: Tensor, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """tokens, scores: [B, t] with EOS ending each row -> one Hypothesis per sentence."""
    results = []
    for row_tokens, row_scores in zip(tokens.tolist(), scores.tolist()):
        n = row_tokens.index(EOS) + 1
        total = sum(row_scores[:n])
        results.append([Hypothesis(row_tokens[:n - 1], total / length_penalty(n, cfg.lenpen, cfg.lenpen_style),
                                   row_scores[:n])])
    return results
