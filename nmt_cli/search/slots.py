"""Beam search over fixed slots: beam.py's search (the same candidates, finishing rule, length penalty and results),
with every sentence's K rows kept in place while it searches, finished ones masked (their beams score -inf), where
beam.py drops them and changes its shapes every step. With CUDA graphs (search/graphs.py, `captured_steps`) the
whole step, the decoder's over preallocated buffers (model/slots.py) and the bookkeeping over a state of fixed
shapes (search/slot_state.py), is captured once per bucket and replayed; eagerly (`Slots`) the decoder step is the
model's `decode_step` and the bookkeeping beam.py's.

A batch shrinks a bounded number of times: with graphs, once the live sentences fit in half of their bucket, their
state moves to the smaller bucket (at most log2(B) moves, shapes fixed between them); eagerly (`Slots.fewer`), once
they fit in three quarters of the slots. The host reads the device once a step (the sentences still searching);
`still_wanted` and `on_done` work as in beam.py.

Shapes: B0 sentences in the call, B >= B0 sentences searched (a graph's bucket may add copies of the first
sentence, done from the start; fewer once the batch shrinks), K beam, N = B*K rows, V vocabulary.

Only a plain beam search runs here (`applies`): rules, sampling and greedy search (beam 1) keep beam.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import BOS
from nmt_cli.search.beam import (
    NEG_INF,
    Finished,
    OnDone,
    StillWanted,
    Unwanted,
    collect,
    constrain,
    finish,
    keep_sentences,
    length_limits,
    max_lengths,
    per_beam,
    start,
    survive,
    tell,
    top_candidates,
)
from nmt_cli.search.graphs import CudaCapture, SlotModel, StepGraphs, bucket_of, sentence_bucket
from nmt_cli.search.hypothesis import Hypothesis
from nmt_cli.search.searchable import SearchEncoderOut
from nmt_cli.search.slot_state import SlotState
from nmt_cli.steps import Steps, to_the_end


@dataclass
class SlotSearch:
    """How a Translator searches over fixed slots: `graphs` holds the captured steps (CUDA), or is None (eager).
    With graphs, a batch holds its bucket's buffers while it searches; batches stepped in turn (serve's) each hold
    their own (graphs.py)."""

    graphs: StepGraphs | None = None


def slot_search_for(fixed_slots: bool, cuda_graphs: bool, device: torch.device) -> SlotSearch | None:
    """The fixed-slot search generate and serve ask for (--fixed-slots); cuda_graphs applies on CUDA only (no CUDA
    call is made elsewhere). None: beam.py's search."""
    if not fixed_slots:
        return None
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    return SlotSearch(StepGraphs(CudaCapture()) if cuda_graphs and on_cuda else None)


def applies(cfg: SearchConfig, has_rules: bool) -> bool:
    """Whether the fixed-slot search runs a search of these settings: a plain beam search (beam > 1, no sampling)
    with no rules (constraints, prefixes, lexical constraints, the n-gram ban)."""
    return cfg.beam > 1 and not cfg.sampling and not has_rules


@torch.inference_mode()
def slot_steps(
    model: SlotModel,
    enc: SearchEncoderOut,
    src_lens: Tensor,
    cfg: SearchConfig,
    n_pieces: int | None = None,
    *,
    graphs: StepGraphs | None = None,
    still_wanted: StillWanted | None = None,
    on_done: OnDone | None = None,
) -> Steps[list[list[Hypothesis]]]:
    """Translate a batch of encoded sentences over fixed slots, one decoder step per resumption: beam.py's
    `beam_steps` without rules (the same arguments and results; `graphs`: replay captured steps, CUDA)."""
    if graphs is not None:
        return (yield from captured_steps(model, enc, src_lens, cfg, n_pieces, graphs, still_wanted, on_done))
    k, device, b0 = cfg.beam, enc.memory.device, enc.memory.shape[0]
    max_len, n_steps, first_max = length_limits(src_lens, cfg, model.max_positions, device)
    slots = Slots.open(model, enc, k)
    state, fin = start(b0, k, n_steps, device)
    unwanted = None if still_wanted is None else Unwanted(still_wanted, device)
    early = None if on_done is None else Early.of(on_done, b0, b0, device)
    row_max_len = per_beam(max_len, k)  # [N]
    prev = torch.full((b0 * k,), BOS, dtype=torch.long, device=device)
    rows: Tensor | None = None  # step 0: every row its own
    for step in range(n_steps):
        log_probs = slots.step(prev, rows, step)  # [N, V]
        log_probs = constrain(log_probs, step, row_max_len, cfg, n_pieces, may_reach_max=step >= first_max)
        top = top_candidates(state.scores, log_probs)
        finish(state, fin, *top, log_probs, step, cfg)
        state, rows = survive(state, *top, log_probs)
        done = finished = fin.count[state.sent_ids] >= k  # [B]
        if unwanted is not None and (gone := unwanted.update()) is not None:
            done = done | gone[state.sent_ids]  # masked with the finished ones, counted in the same host read
        n_live = int(done.logical_not().sum())  # the step's one host synchronisation
        if n_live == 0:
            break
        if early is not None:
            early.tell(fin, cfg.nbest, finished, state.sent_ids, done.shape[0] - n_live)
        fewer = slots.fewer(n_live)
        if fewer is not None:  # the live sentences first, then finished ones up to the smaller slot count
            keep = torch.argsort(done.to(torch.uint8), stable=True)[:fewer]  # [B']
            rows = rows.view(-1, k)[keep].view(-1)
            state, done = keep_sentences(state, keep), done[keep]
            slots.shrink(keep, rows)
            rows = None  # the move applied the reorder
            row_max_len = per_beam(max_len[state.sent_ids], k)
            if early is not None:
                early.n_done = fewer - n_live
        state.scores.masked_fill_(done[:, None], NEG_INF)  # a finished sentence's rows stay, masked
        prev = state.tokens[:, :, -1].reshape(-1)  # [N]
        yield  # a step done
    return collect(fin, cfg.nbest)[:b0]


def captured_steps(
    model: SlotModel,
    enc: SearchEncoderOut,
    src_lens: Tensor,
    cfg: SearchConfig,
    n_pieces: int | None,
    graphs: StepGraphs,
    still_wanted: StillWanted | None,
    on_done: OnDone | None,
) -> Steps[list[list[Hypothesis]]]:
    """`slot_steps` with captured steps: each step the bucket's captured search step (search/slot_state.py's
    `search_step`, replayed), then the host's decisions: stop, tell finished sentences (`on_done`), mask those no
    longer wanted, move to a smaller bucket. The batch fills its bucket with copies of its first sentence, done from
    the start; the finished hypotheses, held by slot, are copied into the call's as the batch moves, tells or ends."""
    k, device, b0 = cfg.beam, enc.memory.device, enc.memory.shape[0]
    host_max_len = max_lengths(src_lens.cpu(), cfg, model.max_positions)  # [B0]
    n_steps = int(host_max_len.numpy().max()) + 1
    bucket = bucket_of(b0, k, n_steps, enc.memory.shape[1], model.max_positions)
    b = bucket.rows // k
    if b > b0:  # the bucket's extra sentences: copies of the first one, done from the start
        enc = enc.select(filled(b0, b).to(device))
        host_max_len = host_max_len[filled(b0, b)]
    cache = model.init_slots(enc, k, n_positions=bucket.n_positions, source_len=bucket.source_len)
    state = SlotState.start(host_max_len.to(device), b0, k, bucket.n_positions, cfg, n_pieces)
    fin = start(b, k, bucket.n_positions, device)[1]  # the call's, by sentence
    padding = [True] * (b - b0)  # the bucket's copies, wanted so that only still_wanted's answers mask sentences
    unwanted = None if still_wanted is None else Unwanted(lambda: [*still_wanted(), *padding], device)
    early = None if on_done is None else Early.of(on_done, b0, b, device)
    captured, batch = graphs.step_for(model, cache, state, bucket)
    try:
        for step in range(n_steps):
            state = captured.step(batch, step)
            done = finished = state.done  # [B]
            gone = None if unwanted is None else unwanted.update()
            if gone is None:
                n_live = int(state.n_live)  # the step's one host synchronisation
            else:  # masked with the finished ones, counted in the same host read
                done = done | gone[state.sent_ids]
                state.scores.masked_fill_(done[:, None], NEG_INF)
                n_live = int(done.logical_not().sum())
            if n_live == 0:
                break
            if early is not None and done.shape[0] - n_live > early.n_done:
                state.flush(fin)
                early.tell(fin, cfg.nbest, finished, state.sent_ids, done.shape[0] - n_live)
            fewer = sentence_bucket(n_live)
            if 2 * fewer <= done.shape[0]:  # the live sentences first, then finished ones up to the smaller bucket
                keep = torch.argsort(done.to(torch.uint8), stable=True)[:fewer]  # [B']
                state.flush(fin)
                moved_cache = captured.cache.select(keep, state.rows.view(-1, k)[keep].view(-1))
                left, moved = captured, bucket._replace(rows=fewer * k)
                captured, batch = graphs.step_for(model, moved_cache, state.select(keep), moved, step + 1)
                left.held = False
                if early is not None:
                    early.n_done = fewer - n_live
            yield  # a step done
        captured.state.flush(fin)
    finally:  # ended, failed or abandoned: its bucket's captured step is free for the next batch
        captured.held = False
    return collect(fin, cfg.nbest)[:b0]


slot_search = to_the_end(slot_steps)


@dataclass
class Early:
    """`on_done` told each sentence's results at the step it finishes, once: finished sentences stay in their slots
    (masked), so those already told are marked, and the host reads which are new only on a step whose count of
    finished (or no longer wanted) sentences in the slots rose."""

    on_done: OnDone
    told: Tensor  # [B] told already, or never to tell (a bucket's copies)
    n_done: int  # sentences in the slots finished or no longer wanted, as the host last counted them

    @classmethod
    def of(cls, on_done: OnDone, b0: int, b: int, device: torch.device) -> Early:
        told = torch.zeros(b, dtype=torch.bool, device=device)
        told[b0:] = True
        return cls(on_done, told, b - b0)

    def tell(self, fin: Finished, nbest: int, finished: Tensor, sent_ids: Tensor, n_done: int) -> None:
        """Tell the sentences of `finished` [B] (the slots' sentences `sent_ids` [B]) not told yet, once n_done
        (the step's count) says some sentence has finished or stopped being wanted."""
        if n_done <= self.n_done:
            return
        self.n_done = n_done
        ids = sent_ids[finished & self.told[sent_ids].logical_not()]  # the one more host read (its size)
        if ids.numel():
            self.told.index_fill_(0, ids, True)
            tell(self.on_done, fin, nbest, ids)


@dataclass
class Slots:
    """A batch's decoder step over its slots, eagerly: the model's own `decode_step` over its cache of the written
    positions (a step to capture needs buffers of fixed shapes, an eager one does not, and the fixed buffers'
    windows cost it strided products and copies: `benchmarks/bench_generate.py --searches default,slots`), and the
    move of its live sentences to fewer slots."""

    model: SlotModel
    k: int
    n_sentences: int  # B, the sentences the slots hold
    cache: Any  # the batch's decoder cache

    @classmethod
    def open(cls, model: SlotModel, enc: SearchEncoderOut, k: int) -> Slots:
        """The slots of a batch of B0 sentences."""
        return cls(model, k, enc.memory.shape[0], model.init_cache(enc, 1))  # all beams equal: `step` expands step 0

    def step(self, prev: Tensor, rows: Tensor | None, step: int) -> Tensor:
        """Row i continues row rows[i] (None: its own) and takes token prev[i] [N] at position `step` -> log-probs
        [N, V]."""
        if step == 0:  # once per sentence, then each sentence's row copied to its K rows (as beam.py's step 0)
            to_beams = per_beam(torch.arange(self.n_sentences, device=prev.device), self.k)
            log_probs, cache = self.model.decode_step(prev[:: self.k], self.cache)
            self.cache = cache.select_rows(to_beams)
            return log_probs[to_beams]
        if rows is not None:
            self.cache = self.cache.select_rows(rows)
        log_probs, self.cache = self.model.decode_step(prev, self.cache)
        return log_probs

    def fewer(self, n_live: int) -> int | None:
        """The smaller number of sentences to move the slots to once n_live sentences are still searching, or None
        to stay: n_live itself once that is at most three quarters of them. A move costs one copy of the live rows'
        state, and a finished row costs a step as much as a live one, so waiting for half of them to finish loses
        more than the extra moves cost (at most log_4/3(B) moves; `benchmarks/bench_generate.py --lengths natural
        --searches default,slots --rounds 4`)."""
        return n_live if 4 * n_live <= 3 * self.n_sentences else None

    def shrink(self, keep: Tensor, rows: Tensor) -> None:
        """Move to the sentences `keep` [B'] alone, row i continuing row rows[i] ([B'*K])."""
        self.n_sentences = keep.shape[0]
        self.cache = self.cache.select_sentences(keep, rows)


def filled(b0: int, b: int) -> Tensor:
    """[B] the B0 sentences, then the first one again up to B (a bucket's sentences)."""
    return torch.cat([torch.arange(b0), torch.zeros(b - b0, dtype=torch.long)])
