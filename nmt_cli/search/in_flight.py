"""In-flight batching over fixed slots: a beam search whose finished sentences leave their slots to new ones
between two steps, as TensorRT-LLM batches an encoder-decoder's requests (`nmt serve --in-flight`).

`in_flight_steps` is search/slots.py's search of one batch with one more argument, an `InFlight`: between two
steps, while some slots are free (their sentences finished, no longer wanted, or never filled), it asks
`InFlight.admit` for sentences to start in them. A new sentence is encoded at once, its cross-attention keys and
values written into a free slot (SlotCache.admit), its search state started there (SlotState.admit), and from the
next step it searches at its own positions beside the others (each row steps at its own position:
model/slots.py). Nothing changes shape, so the bucket's captured steps replay for it (search/graphs.py); without
graphs each step runs eagerly over the same buffers (`search_step`). The host asks and encodes right after
launching a step, before reading its result, so that on CUDA that work overlaps the step; the slots it fills are
those free before the step (a slot left at one step is filled after the next one's launch), and what it writes
runs after the step on the same stream.

The bucket is chosen when the search starts: as many sentences as `InFlight.capacity` asks within its token
budget (at least the first batch's, rounded up as graphs.py rounds them), the first batch's source length rounded
up to a multiple of 64, and the positions of the longest output a source of that length may have. A sentence fits
when its source does (`admit` is told the longest that fits). The bucket never moves to fewer slots: a slot left
free is one a returning client may take.

The call's sentences are the first batch's (0..B0-1), then the admitted ones, numbered in the order `admit` gave
them. Each is told to `on_done` at the step it finishes (one more host read on such steps, as in beam.py). The list
returned holds the first batch's results, then, without `on_done`, the admitted ones' (those no longer wanted: what
they had, to be discarded): with `on_done` an admitted sentence's results are told and not kept, so that a search
that admits for hours holds no more than its slots' sentences. The host reads the device once a step otherwise:
the count of sentences still searching. The search ends once none searches and `admit` gives none.

Shapes: B slots, K beam, N = B*K rows, A sentences admitted at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.runtime import to_device_async
from nmt_cli.search.beam import OnDone, StillWanted, collect, max_lengths, per_beam
from nmt_cli.search.graphs import (
    POSITION_STEP,
    Bucket,
    Captured,
    SlotModel,
    StepGraphs,
    round_up,
    sentence_bucket,
    window_of,
)
from nmt_cli.search.hypothesis import Hypothesis
from nmt_cli.search.searchable import SearchEncoderOut
from nmt_cli.search.slot_state import SlotState, search_step
from nmt_cli.search.slots import filled
from nmt_cli.steps import Steps

# sources -> their encoder output and lengths [A] (on the host), as the batch's were encoded, with no host wait
Encode = Callable[[Sequence[np.ndarray]], tuple[SearchEncoderOut, Tensor]]


@dataclass
class InFlight:
    """What an in-flight search asks of its caller (serve's batcher): `admit(free, slots, longest)` gives at most
    `free` sources (token ids, no EOS, 1 to `longest` pieces each) to start now, taken from its queue (`slots`: the
    search's slots in all); `capacity`: the sentences the bucket should hold (the clients the caller expects),
    within `max_tokens` padded source tokens (the caller's batch budget; 0: no bound)."""

    admit: Callable[[int, int, int], list[np.ndarray]]
    capacity: int = 0
    max_tokens: int = 0

    def decline(self) -> None:
        """Tell the caller that this search takes none (not one over fixed slots, or its sources made several
        batches): an `admit` of none, into no slots, of no length."""
        self.admit(0, 0, 0)


def longest_source(source_len: int, cfg: SearchConfig, n_positions: int, max_positions: int) -> int:
    """The longest source, in pieces, whose search fits a bucket of source_len (EOS included) and n_positions."""
    outputs = max_lengths(torch.arange(1, source_len), cfg, max_positions).numpy()  # of sources of 1..S-1 pieces
    return int(np.count_nonzero(outputs + 1 <= n_positions))  # outputs grow with the source: those that fit first


@torch.inference_mode()
def in_flight_steps(
    model: SlotModel,
    enc: SearchEncoderOut,
    src_lens: Tensor,
    cfg: SearchConfig,
    n_pieces: int | None,
    encode: Encode,
    in_flight: InFlight,
    *,
    graphs: StepGraphs | None = None,
    still_wanted: StillWanted | None = None,
    on_done: OnDone | None = None,
) -> Steps[list[list[Hypothesis]]]:
    """Translate a batch of encoded sentences over fixed slots, one step per resumption, admitting new sentences
    into free slots between steps (see the module's docstring). `still_wanted` answers for every sentence of the
    call so far, the admitted ones included (asked once a step, for the sentences in the slots alone)."""
    k, device, b0 = cfg.beam, enc.memory.device, enc.memory.shape[0]
    source_len = round_up(enc.memory.shape[1], POSITION_STEP)
    longest_out = int(max_lengths(torch.tensor([source_len - 1]), cfg, model.max_positions).numpy()[0])
    n_positions = min(round_up(longest_out + 1, POSITION_STEP), model.max_positions)
    longest = longest_source(source_len, cfg, n_positions, model.max_positions)
    capacity = in_flight.capacity
    if in_flight.max_tokens:
        capacity = min(capacity, in_flight.max_tokens // source_len)
    b = sentence_bucket(max(b0, capacity))
    bucket = Bucket(b * k, n_positions, source_len)
    fill = filled(b0, b)  # the free slots hold copies of the first sentence, done from the start
    max_len = max_lengths(src_lens.cpu(), cfg, model.max_positions)[fill]
    cache = model.init_slots(enc.select(fill.to(device)), k, n_positions=n_positions, source_len=source_len)
    state = SlotState.start(max_len.to(device), b0, k, n_positions, cfg, n_pieces)
    stepper = Stepper.of(model, cache, state, bucket, graphs)
    owner: list[int | None] = [*range(b0), *([None] * (b - b0))]  # the call's sentence in each slot
    started = np.zeros(b, dtype=np.int64)  # the step each slot's sentence started at
    results: list[list[Hypothesis]] = [[] for _ in range(b0)]  # and the admitted ones' without on_done
    n_called, n_searching = b0, b0
    try:
        for step in range(1 << 62):
            live = [s for s in range(b) if owner[s] is not None]
            if live:  # on CUDA the step runs on while the host takes and encodes what joins after it
                stepper.step(int(max(step - started[s] for s in live)))
            free = [s for s in range(b) if owner[s] is None]  # free before this step: its ends are read below
            sources = in_flight.admit(len(free), b, longest) if free or step == 0 else []  # the first: told the slots
            if sources:
                slots = free[: len(sources)]
                admit(stepper, encode, sources, slots, cfg, model.max_positions)
                for s in slots:
                    owner[s], started[s] = n_called, step + 1
                    n_called += 1
                if on_done is None:
                    results += [[] for _ in slots]
            if live:
                n_live = int(stepper.state.n_live)  # the step's one host synchronisation: those admitted not counted
                if n_live < n_searching:  # some finished: the one more host read (the admitted ones are not done)
                    done = stepper.state.done.cpu().numpy()
                    finished = [s for s in live if done[s]]
                    ended(stepper.state, finished, owner, results, cfg.nbest, on_done)
                n_searching = n_live
            n_searching += len(sources)
            if still_wanted is not None:
                wanted = still_wanted()
                gone = [s for s in range(b) if (i := owner[s]) is not None and not wanted[i]]
                if gone:
                    stepper.stop(gone)
                    ended(stepper.state, gone, owner, results, cfg.nbest, None)
                    n_searching -= len(gone)
            if n_searching == 0:
                break
            yield  # a step done
    finally:  # ended, failed or abandoned: its bucket's captured step is free for the next batch
        stepper.release()
    return results


def ended(
    state: SlotState,
    slots: list[int],
    owner: list[int | None],
    results: list[list[Hypothesis]],
    nbest: int,
    on_done: OnDone | None,
) -> None:
    """The sentences in `slots` have ended: their results collected from their slots' finished hypotheses, told to
    `on_done` when given and kept in `results` where it has a place for them, the slots freed."""
    if not slots:
        return
    for s, hyps in zip(slots, collect(state.fin, nbest, torch.tensor(slots, device=state.done.device))):
        i = owner[s]
        assert i is not None, "only an occupied slot ends"
        owner[s] = None
        if i < len(results):
            results[i] = hyps
        if on_done is not None:
            on_done(i, hyps)


def admit(
    stepper: Stepper,
    encode: Encode,
    sources: Sequence[np.ndarray],
    slots: list[int],
    cfg: SearchConfig,
    max_positions: int,
) -> None:
    """Start `sources` in the free `slots`: encoded, their cross-attention written into the slots' buffers and their
    search state started there."""
    enc, src_lens = encode(sources)
    device = enc.memory.device
    bucket, k = stepper.bucket, stepper.state.scores.shape[1]
    theirs = stepper.model.init_slots(enc, k, n_positions=1, source_len=bucket.source_len)
    at = to_device_async(torch.tensor(slots), device)  # no copy here waits for the step queued before
    stepper.cache.admit(theirs, at)
    stepper.state.admit(at, to_device_async(max_lengths(src_lens.cpu(), cfg, max_positions), device))


@dataclass
class Stepper:
    """A bucket's cache and search state, stepped by its captured step (graphs) or eagerly (`search_step`)."""

    model: SlotModel
    bucket: Bucket
    cache: Any  # a SlotCache, or an ensemble's
    state: SlotState
    captured: Captured | None
    batch: int

    @classmethod
    def of(cls, model: SlotModel, cache: Any, state: SlotState, bucket: Bucket, graphs: StepGraphs | None) -> Stepper:
        if graphs is None:
            return cls(model, bucket, cache, state, None, 0)
        captured, batch = graphs.step_for(model, cache, state, bucket)
        return cls(model, bucket, captured.cache, captured.state, captured, batch)

    def step(self, position: int) -> None:
        """The search step, reading the positions up to `position` (the furthest slot's)."""
        if self.captured is not None:
            self.captured.step(self.batch, position)
        else:
            search_step(self.model, self.cache, self.state, window_of(position, self.bucket.n_positions))

    def stop(self, slots: list[int]) -> None:
        """Stop the sentences in `slots` (no longer wanted): done, masked, their rows parked at once (the next
        step's window is the live slots' and must hold every row's position)."""
        at = torch.tensor(slots, device=self.state.done.device)
        self.state.stop(at)
        stopped = torch.zeros_like(self.state.done).index_fill_(0, at, True)
        self.cache.park(per_beam(stopped, self.state.scores.shape[1]))

    def release(self) -> None:
        if self.captured is not None:
            self.captured.held = False
