"""Beam search over fixed slots: the same search as beam.py's `beam_search` (the same candidates, finishing rule,
length penalty and results), with every sentence's K rows kept in place for the whole batch.

Today's search (beam.py) drops finished sentences from the batch and grows each layer's keys and values by a step
each step: shapes change every step. Here a finished sentence's rows stay, masked (their beams score -inf, so
none of their candidates finishes or survives), and the decoder steps over fixed slots (model/slots.py): no tensor
of the step changes shape between steps, which lets the step be captured once as a CUDA graph per bucket and
replayed (search/graphs.py). The host reads the device once a step, to learn whether every sentence is done.

Shapes: B0 sentences in the call, B >= B0 sentences searched (a graph's bucket may add copies of the first
sentence, done from the start), K beam, N = B*K rows, V vocabulary.

Only a plain beam search runs here (`applies`); constraints, prefixes, lexical constraints, n-gram bans,
sampling, greedy search (beam 1) and serve's stepping with `still_wanted` keep beam.py's search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import BOS
from nmt_cli.search.beam import (
    NEG_INF,
    Steps,
    collect,
    constrain,
    finish,
    max_lengths,
    per_beam,
    start,
    survive,
    to_the_end,
    top_candidates,
)
from nmt_cli.search.graphs import SlotModel, StepGraphs, bucket_of, cuda_capture
from nmt_cli.search.hypothesis import Hypothesis
from nmt_cli.search.searchable import SearchEncoderOut

# A step: (previous tokens [N], the row each row continues [N] or None, the step index) -> log-probs [N, V]
Step = Callable[[Tensor, Tensor | None, int], Tensor]


@dataclass
class SlotSearch:
    """How a Translator searches over fixed slots: `graphs` holds the captured steps (CUDA), or is None (eager).
    With graphs, the batches of one bucket share buffers: their searches run one after the other (translate's),
    never interleaved."""

    graphs: StepGraphs | None = None


def slot_search_for(fixed_slots: bool, cuda_graphs: bool, device: torch.device) -> SlotSearch | None:
    """The fixed-slot search generate asks for (--fixed-slots); cuda_graphs applies on CUDA only (no CUDA call is
    made elsewhere). None: beam.py's search."""
    if not fixed_slots:
        return None
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    return SlotSearch(StepGraphs(cuda_capture) if cuda_graphs and on_cuda else None)


def applies(cfg: SearchConfig, has_rules: bool) -> bool:
    """Whether the fixed-slot search runs a search of these settings: a plain beam search (beam > 1, no sampling)
    with no rules (constraints, prefixes, lexical constraints, the n-gram ban) and no `still_wanted`."""
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
) -> Steps[list[list[Hypothesis]]]:
    """Translate a batch of encoded sentences over fixed slots, one decoder step per resumption: beam.py's
    `beam_steps` without constraints (the same arguments; `graphs`: replay captured steps, CUDA).

    Returns:
        For each of the B0 sentences, `cfg.nbest` hypotheses, best first.
    """
    k, device, b0 = cfg.beam, enc.memory.device, enc.memory.shape[0]
    host_max_len = max_lengths(src_lens.cpu(), cfg, model.max_positions)  # [B0]
    n_steps, first_max = int(host_max_len.numpy().max()) + 1, int(host_max_len.numpy().min())
    step_fn, b = stepper(model, enc, k, n_steps, graphs)
    if b > b0:  # the bucket's extra sentences: copies of the first one, done from the start
        host_max_len = host_max_len[filled(b0, b)]
    max_len = host_max_len.to(device)
    state, fin = start(b, k, n_steps, device)
    fin.count[b0:] = k
    row_max_len = per_beam(max_len, k)  # [N]
    prev = torch.full((b * k,), BOS, dtype=torch.long, device=device)
    rows: Tensor | None = None  # step 0: every row its own
    for step in range(n_steps):
        log_probs = step_fn(prev, rows, step)  # [N, V]
        log_probs = constrain(log_probs, step, row_max_len, cfg, n_pieces, may_reach_max=step >= first_max)
        scores, beams, tokens = top_candidates(state, log_probs)
        finish(state, fin, scores, beams, tokens, log_probs, step, cfg)
        state, rows = survive(state, scores, beams, tokens, log_probs)
        done = fin.count >= k  # [B]
        if bool(done.all()):  # the step's one host synchronisation
            break
        state.scores.masked_fill_(done[:, None], NEG_INF)  # a finished sentence's rows stay, masked
        prev = state.tokens[:, :, -1].reshape(-1)  # [N]
        yield  # a step done
    return collect(fin, cfg.nbest)[:b0]


slot_search = to_the_end(slot_steps)


def stepper(
    model: SlotModel, enc: SearchEncoderOut, k: int, n_steps: int, graphs: StepGraphs | None
) -> tuple[Step, int]:
    """The batch's decoder step and the number of sentences B it searches: eagerly over the positions written so
    far (B = B0), or replaying the captured step of the batch's bucket (B: the bucket's sentences)."""
    b0, source_len = enc.memory.shape[0], enc.memory.shape[1]
    if graphs is None:
        own = model.init_slots(enc, k, n_positions=n_steps, source_len=source_len)

        def eager(prev: Tensor, rows: Tensor | None, step: int) -> Tensor:
            return model.decode_slots(prev, rows, own, step + 1)

        return eager, b0
    bucket = bucket_of(b0, k, n_steps, source_len, model.max_positions)
    b = bucket.rows // k
    if b > b0:
        enc = enc.select(filled(b0, b).to(enc.memory.device))
    cache = model.init_slots(enc, k, n_positions=bucket.n_positions, source_len=bucket.source_len)
    captured, batch = graphs.step_for(model, cache, bucket)
    return (lambda prev, rows, step: captured.step(prev, rows, batch)), b


def filled(b0: int, b: int) -> Tensor:
    """[B] the B0 sentences, then the first one again up to B (a bucket's sentences)."""
    return torch.cat([torch.arange(b0), torch.zeros(b - b0, dtype=torch.long)])
