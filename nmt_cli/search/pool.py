"""Beam search over a set of sentences that changes between steps (continuous batching), for `nmt serve`.

`beam_search` searches a batch from its first step to its last: a sentence that arrives meanwhile waits for
the whole batch, and the batch thins out as its sentences finish. A `BeamPool` instead takes new sentences
(`add`) before any step: they join the running search at their own step 0, and every finished sentence
leaves it at once (`step` returns it). Under a steady stream of requests the decoder runs on as many
sentences as there are in flight, and a sentence waits one step, not one batch, to start.

The search is `beam_search`'s, sentence by sentence, with its functions: the same candidates (`top_candidates`),
rules (`constrain`), finished and surviving hypotheses (`finish`, `survive`), stopping rule (K finished
hypotheses, or the maximum length a * |x| + b with EOS forced) and scores. What differs is where things are
kept, as each sentence is at its own step t:
- hypotheses are stored left-aligned in [B, K, W] buffers, W the longest allowed output + 1 in the pool, and
  each step writes its token at column t (`finish` and `survive` given the steps; beam_search appends a column);
- the decoder's self-attention state keeps one column per pool step: a sentence that joined at column c
  is at position t = column - c and attends to its own columns only (DecoderCache.starts), and the columns
  that no sentence uses any more are dropped (views, no copy);
- the cross-attention keys and values of the sentences in the pool are padded to the longest source among
  them (scores -inf at padding, DecoderCache.cross_bias).
The numbers for a sentence are those of beam_search up to float rounding (a different batch around it).

Shapes: B sentences in the pool, K beam, N = B*K rows (sentence-major), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.batching import pad_sources
from nmt_cli.data.vocab import BOS, PAD
from nmt_cli.model.attention import attention_bias
from nmt_cli.model.cache import DecoderCache
from nmt_cli.model.transformer import Transformer
from nmt_cli.runtime import autocast
from nmt_cli.search.beam import (
    BeamState,
    Finished,
    collect,
    constrain,
    finish,
    keep_sentences,
    max_lengths,
    per_beam,
    start,
    survive,
    top_candidates,
)
from nmt_cli.search.hypothesis import Hypothesis


class BeamPool:
    """A running beam search (cfg.beam, no sampling, no constraint) that sentences join and leave between steps.

    add(sources, tags) queues sentences (token ids without EOS, each 1 to max_positions - 1 pieces long) to join
    at the next step; step() advances every sentence one token and returns the (tag, nbest hypotheses) of
    those that finished; drop(tags) makes sentences leave at the next step without a result (their requests
    were cancelled). len(pool): the sentences searching or about to join.
    """

    def __init__(
        self,
        model: Transformer,
        cfg: SearchConfig,
        n_pieces: int,
        device: torch.device,
        amp_dtype: torch.dtype | None = None,
    ) -> None:
        assert not cfg.sampling, "a pool runs beam search"
        self.model, self.cfg, self.n_pieces, self.device, self.amp_dtype = model, cfg, n_pieces, device, amp_dtype
        self.k = cfg.beam
        self._joining: list[tuple[np.ndarray, Hashable]] = []
        self._reset()

    def _reset(self) -> None:
        """An empty pool: no sentences, no decoder state."""
        self.tags: list[Hashable] = []  # [B] the caller's tag of each sentence
        self.dropped = np.zeros(0, dtype=bool)  # [B] leave at the next step, without a result
        self.src_lens = np.zeros(0, dtype=np.int64)  # [B] source pieces without EOS
        self.steps = np.zeros(0, dtype=np.int64)  # [B] tokens generated so far (the position of the next one)
        self.max_len = np.zeros(0, dtype=np.int64)  # [B] the longest allowed output, without EOS
        self.steps_on_device = torch.zeros(0, dtype=torch.long, device=self.device)  # the same two, kept there
        self.max_len_on_device = torch.zeros(0, dtype=torch.long, device=self.device)
        self.cache: DecoderCache | None = None
        self.starts = np.zeros(0, dtype=np.int64)  # [B] the decoder state's column of each sentence's step 0
        self.state: BeamState | None = None
        self.fin: Finished | None = None
        self.prev: Tensor | None = None  # [N] each row's last token

    def __len__(self) -> int:
        return len(self.tags) + len(self._joining)

    def add(self, sources: Sequence[np.ndarray], tags: Sequence[Hashable]) -> None:
        limit = self.model.max_positions - 1
        for src, tag in zip(sources, tags):
            assert 0 < len(src) <= limit, f"a pool takes 1 to {limit} source pieces, not {len(src)}"
            self._joining.append((np.asarray(src, dtype=np.int64), tag))

    def drop(self, tags: Sequence[Hashable]) -> None:
        gone = set(tags)
        self._joining = [(src, tag) for src, tag in self._joining if tag not in gone]
        self.dropped |= np.array([tag in gone for tag in self.tags], dtype=bool)

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """Let the queued sentences join, advance every sentence one token; the sentences finished at it."""
        with autocast(self.device, self.amp_dtype):
            if self._joining:
                self._join()
            if not self.tags:
                return []
            return self._advance()

    def _join(self) -> None:
        sources, tags = zip(*self._joining)
        self._joining = []
        b_new, k = len(sources), self.k
        lens = np.array([len(s) for s in sources], dtype=np.int64)
        src = to_device(pad_sources(list(sources)), self.device)
        enc = self.model.encode(src, None if lens.min() == lens.max() else src.eq(PAD))
        new = self.model.init_cache(enc, k)  # cross-attention K/V of the new sentences, empty self-attention
        max_len = max_lengths(torch.from_numpy(lens), self.cfg, self.model.max_positions).numpy()
        width = int(max(max_len.max(), self.max_len.max(initial=0))) + 1
        empty, fin = start(b_new, k, width, self.device)  # only beam 0 is live at first: the K beams start equal
        state = BeamState(  # as beam_search's, but left-aligned in `width` columns
            torch.full((b_new, k, width), PAD, dtype=torch.long, device=self.device),
            empty.scores,
            torch.zeros(b_new, k, width, device=self.device),
            empty.sent_ids,
        )
        prev = torch.full((b_new * k,), BOS, dtype=torch.long, device=self.device)
        if self.cache is None or self.state is None or self.fin is None or self.prev is None:
            self.cache, self.state, self.fin, self.prev = new, state, fin, prev
            self.starts = np.zeros(b_new, dtype=np.int64)
        else:
            self.cache = joined_cache(self.cache, new, k)
            self.state = joined_state(self.state, state)
            self.fin = joined_finished(self.fin, fin)
            self.prev = torch.cat([self.prev, prev])
            self.starts = np.concatenate([self.starts, np.full(b_new, self.cache.length, dtype=np.int64)])
        self.tags += tags
        self.dropped = np.concatenate([self.dropped, np.zeros(b_new, dtype=bool)])
        self.src_lens = np.concatenate([self.src_lens, lens])
        self.steps = np.concatenate([self.steps, np.zeros(b_new, dtype=np.int64)])
        self.max_len = np.concatenate([self.max_len, max_len])
        self.steps_on_device = torch.cat([self.steps_on_device, self.steps_on_device.new_zeros(b_new)])
        self.max_len_on_device = torch.cat([self.max_len_on_device, to_device(torch.from_numpy(max_len), self.device)])
        self._set_masks()

    def _set_masks(self) -> None:
        """The decoder state's per-row starts and the source padding, after the sentences changed."""
        assert self.cache is not None
        self.cache.starts = (
            None if not self.starts.any() else per_beam(to_device(torch.from_numpy(self.starts), self.device), self.k)
        )
        s = int(self.src_lens.max()) + 1  # the longest source with its EOS; longer columns are nobody's
        self.cache.cross_k = [x[:, :, :s] for x in self.cache.cross_k]
        self.cache.cross_v = [x[:, :, :s] for x in self.cache.cross_v]
        pad = np.arange(s)[None, :] > self.src_lens[:, None]  # [B, S] True at padding (known on the host)
        on_device = to_device(torch.from_numpy(pad), self.device)
        self.cache.cross_bias = attention_bias(on_device, self.cache.cross_k[0].dtype) if pad.any() else None

    def _advance(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        assert self.cache is not None and self.state is not None and self.fin is not None and self.prev is not None
        k, b = self.k, len(self.tags)
        steps, max_len = self.steps_on_device, self.max_len_on_device
        log_probs, self.cache = self.model.decode_step(self.prev, self.cache)  # [N, V]
        may_reach_max = bool((self.steps >= self.max_len).any())
        log_probs = constrain(
            log_probs, per_beam(steps, k), per_beam(max_len, k), self.cfg, self.n_pieces, may_reach_max
        )
        scores, beams, tokens = top_candidates(self.state, log_probs)
        finish(self.state, self.fin, scores, beams, tokens, log_probs, steps, self.cfg)
        self.state, rows, new_tokens = survive(self.state, scores, beams, tokens, log_probs, steps)
        done_on_device = (self.fin.count >= k) | (steps >= max_len)  # K finished, or EOS was forced
        if self.dropped.any():
            done_on_device |= to_device(torch.from_numpy(self.dropped), self.device)
        done = done_on_device.cpu().numpy()  # the step's one host synchronisation
        self.steps += 1
        self.steps_on_device = steps + 1
        self.prev = new_tokens.view(-1)
        if not done.any():
            self.cache = self.cache.select_rows(rows)
            return []
        # The sentences done, and those going on, in order, chosen on the device (no copy of indices to it)
        n_done = int(done.sum())
        order = torch.argsort(done_on_device.to(torch.uint8), stable=True)
        keep, ended = order[: b - n_done], order[b - n_done :]
        results = collect(select_finished(self.fin, ended), self.cfg.nbest)
        out = [(self.tags[i], hyps) for i, hyps in zip(np.flatnonzero(done), results) if not self.dropped[i]]
        keep_host = np.flatnonzero(~done)
        if len(keep_host) == 0:
            self._reset()
            return out
        rows = rows.view(b, k)[keep].view(-1)
        self.cache = self.cache.select_sentences(keep, rows)
        kept = keep_sentences(self.state, keep)  # sent_ids stay 0 to B' - 1: the kept Finished rows (below)
        self.state = replace(kept, sent_ids=torch.arange(len(keep_host), device=self.device))
        self.fin = select_finished(self.fin, keep)
        self.steps_on_device, self.max_len_on_device = self.steps_on_device[keep], self.max_len_on_device[keep]
        self.prev = self.prev.view(b, k)[keep].view(-1)
        self.tags = [self.tags[i] for i in keep_host]
        for name in ("dropped", "src_lens", "steps", "max_len", "starts"):
            setattr(self, name, getattr(self, name)[keep_host])
        first = int(self.starts.min())  # the columns before it belong to sentences that have left
        if first:
            self.cache.self_k = [x[:, :, first:] for x in self.cache.self_k]
            self.cache.self_v = [x[:, :, first:] for x in self.cache.self_v]
            self.starts -= first
        self._set_masks()
        return out


def to_device(x: Tensor, device: torch.device) -> Tensor:
    """A host tensor on `device`; on CUDA through pinned memory, so that the host does not wait for the device
    (a copy from pageable memory waits for the stream to drain first)."""
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def select_finished(fin: Finished, sentences: Tensor) -> Finished:
    return Finished(
        fin.tokens[sentences],
        fin.step_scores[sentences],
        fin.lengths[sentences],
        fin.scores[sentences],
        fin.count[sentences],
    )


def widen(x: Tensor, width: int, value: float) -> Tensor:
    """x [..., W] padded with `value` to [..., width]."""
    return x if x.shape[-1] >= width else F.pad(x, (0, width - x.shape[-1]), value=value)


def joined_state(old: BeamState, new: BeamState) -> BeamState:
    """The pool's hypotheses with new sentences' appended. sent_ids index the pool's Finished, whose rows are
    the state's own (kept and dropped with them): 0 to B - 1 in order."""
    width = max(old.tokens.shape[2], new.tokens.shape[2])
    return BeamState(
        torch.cat([widen(old.tokens, width, PAD), widen(new.tokens, width, PAD)]),
        torch.cat([old.scores, new.scores]),
        torch.cat([widen(old.step_scores, width, 0.0), widen(new.step_scores, width, 0.0)]),
        torch.arange(old.scores.shape[0] + new.scores.shape[0], device=old.scores.device),
    )


def joined_finished(old: Finished, new: Finished) -> Finished:
    width = max(old.tokens.shape[2], new.tokens.shape[2])
    return Finished(
        torch.cat([widen(old.tokens, width, PAD), widen(new.tokens, width, PAD)]),
        torch.cat([widen(old.step_scores, width, 0.0), widen(new.step_scores, width, 0.0)]),
        torch.cat([old.lengths, new.lengths]),
        torch.cat([old.scores, new.scores]),
        torch.cat([old.count, new.count]),
    )


def joined_cache(old: DecoderCache, new: DecoderCache, k: int) -> DecoderCache:
    """The pool's decoder state with new sentences' rows appended (their self-attention state empty).

    The new rows' columns so far are filled from stored row 0 through the pending reorder (`rows`): any finite
    values do, as the new rows do not attend to them (starts), and no self-attention state is copied here.
    The cross-attention K/V are padded to the longer source and concatenated, keeping init_cache's layout.
    """
    n_stored = old.self_k[0].shape[0]
    old_rows = old.rows if old.rows is not None else torch.arange(n_stored, device=old.self_k[0].device)
    n_new = new.cross_k[0].shape[0] * k
    rows = torch.cat([old_rows, old_rows.new_zeros(n_new)])
    s = max(old.cross_k[0].shape[2], new.cross_k[0].shape[2])

    def joined(a: Tensor, b: Tensor) -> Tensor:  # [B, H, S, D] each, padded to S rows, in a's memory layout
        transposed = a.stride(-2) == 1 and a.stride(-1) != 1  # init_cache's K^T on the CPU
        if transposed:
            a, b = a.transpose(-1, -2), b.transpose(-1, -2)
            both = torch.cat([F.pad(a, (0, s - a.shape[-1])), F.pad(b, (0, s - b.shape[-1]))])
            return both.transpose(-1, -2)
        return torch.cat([F.pad(a, (0, 0, 0, s - a.shape[-2])), F.pad(b, (0, 0, 0, s - b.shape[-2]))])

    return DecoderCache(
        old.self_k,
        old.self_v,
        [joined(a, b) for a, b in zip(old.cross_k, new.cross_k)],
        [joined(a, b) for a, b in zip(old.cross_v, new.cross_v)],
        None,  # set by the pool from the sources' lengths
        rows,
    )


def pool_searches(cfg: SearchConfig) -> bool:
    """Whether a BeamPool runs these settings as generate would: beam search (beam 1 is greedy search there)."""
    return cfg.beam > 1 and not cfg.sampling
