"""Beam search over fixed slots: beam.py's search (the same candidates, finishing rule, length penalty and results),
with every sentence's K rows kept in place while it searches, finished ones masked (their beams score -inf), where
beam.py drops them and changes its shapes every step: the whole step, the decoder's over preallocated buffers
(model/slots.py) and the bookkeeping over a state of fixed shapes (search/slot_state.py), is captured once per
bucket as a CUDA graph and replayed (search/graphs.py), or run eagerly without graphs (`run_eagerly`: the CPU,
--no-cuda-graphs), the same search.

Once the live sentences fit in half of their bucket, their state moves to the smaller bucket (at most log2(B) moves,
shapes fixed between them). The host reads the device once a step (the sentences still searching); `still_wanted`
and `on_done` work as in beam.py.

Shapes: B0 sentences in the call, B >= B0 sentences searched (a bucket may add copies of the first sentence, done
from the start; fewer once the batch shrinks), K beam, N = B*K rows, V vocabulary.

Only a plain beam search runs here (`applies`): rules, sampling and greedy search (beam 1) keep beam.py's."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.search.beam import (
    NEG_INF,
    Finished,
    OnDone,
    StillWanted,
    Unwanted,
    collect,
    max_lengths,
    start,
    tell,
)
from nmt_cli.search.graphs import CudaCapture, SlotModel, StepGraphs, bucket_of, run_eagerly, sentence_bucket
from nmt_cli.search.hypothesis import Hypothesis
from nmt_cli.search.searchable import SearchEncoderOut
from nmt_cli.search.slot_state import SlotState
from nmt_cli.steps import Steps, to_the_end


@dataclass
class SlotSearch:
    """How a Translator searches over fixed slots: `graphs` holds the captured steps (CUDA graphs, or run eagerly).
    A batch holds its bucket's buffers while it searches; batches stepped in turn (serve's) each hold their own."""

    graphs: StepGraphs

    @property
    def cuda_graphs(self) -> bool:
        return isinstance(self.graphs.capture, CudaCapture)


def slot_search_for(fixed_slots: bool, cuda_graphs: bool, device: torch.device) -> SlotSearch | None:
    """The fixed-slot search generate and serve ask for (--fixed-slots); cuda_graphs applies on CUDA only (no CUDA
    call is made elsewhere). None: beam.py's search."""
    if not fixed_slots:
        return None
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    return SlotSearch(StepGraphs(CudaCapture() if cuda_graphs and on_cuda else run_eagerly))


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
    graphs: StepGraphs,
    still_wanted: StillWanted | None = None,
    on_done: OnDone | None = None,
) -> Steps[list[list[Hypothesis]]]:
    """beam.py's `beam_steps` without rules over fixed slots (the same arguments and results): each step the bucket's
    captured search step (slot_state.py's `search_step`), then the host's decisions: stop, tell finished sentences,
    mask those no longer wanted, move to a smaller bucket (the finished hypotheses, held by slot, copied then)."""
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


def filled(b0: int, b: int) -> Tensor:
    """[B] the B0 sentences, then the first one again up to B (a bucket's sentences)."""
    return torch.cat([torch.arange(b0), torch.zeros(b - b0, dtype=torch.long)])
