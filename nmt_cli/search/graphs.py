"""CUDA graphs of the fixed-slot search step (search/slots.py): the decoder step and the search's bookkeeping
(search/slot_state.py's `search_step`) are captured once per bucket and replayed for every later step of every
batch of that bucket: the host launches one graph a step and reads one number.

A bucket is the step's shapes: rows (B*K, sentences rounded up to a power of two up to 64, beyond to a multiple
of 64), the self-attention positions (the longest output + 1, rounded up to a multiple of 64, within the model's
positions) and the source length (rounded up to a multiple of 64). Batches of one bucket share one captured step,
their state loaded into the bucket's own buffers, whose addresses the graph holds; a batch whose sentences finish
moves to the smaller buckets of its positions and source length. At most `max_graphs` buckets are kept (the least
recently used dropped). Within a bucket, a step reads (and reorders) only a window of the positions, its own + 1
rounded up to WINDOW_STEP, each window captured when a step first needs it, over the same buffers. All captures
share one memory pool: a step's tensors live within its replay, and replays never overlap.

A batch holds its bucket's captured step from `step_for` until it moves or ends (`Captured.held`): serve's worker
steps two batches in turn, and a second batch of the bucket gets a capture of its own.

Everything here but `CudaCapture` is plain Python over a `Capture` function: `run_eagerly` runs the same step
without graphs."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from nmt_cli.search.slot_state import SlotState, search_step

logger = logging.getLogger(__name__)

POSITION_STEP = 64  # self-attention positions and source lengths are rounded up to a multiple of this
WINDOW_STEP = 32  # a step reads the self-attention positions up to its own rounded up to a multiple of this
SENTENCE_STEP = 64  # sentences: a power of two up to this, beyond a multiple of it
MAX_GRAPHS = 16  # a batch that shrinks adds up to log2(B) smaller buckets of its positions and source length

# Records `run` (a step over fixed buffers) and returns what replays it.
Capture = Callable[[Callable[[], None]], Callable[[], None]]


class Bucket(NamedTuple):
    rows: int  # B*K
    n_positions: int  # L, self-attention positions
    source_len: int  # S, cross-attention positions


class SlotCacheLike(Protocol):
    """What the graphs ask of a fixed-slot cache (model/slots.py's SlotCache, or an ensemble's)."""

    def select(self, sentences: Tensor, rows: Tensor) -> Any: ...

    def load(self, other: Any, written: int) -> None: ...

    def steps(self) -> Any: ...

    def restart(self, steps: Any) -> None: ...

    def park(self, rows: Tensor) -> None: ...


class SlotModel(Protocol):
    """A model that steps over fixed slots (`init_slots`, `decode_slots`): a Transformer (model/transformer.py) or an
    Ensemble (ensemble.py)."""

    max_positions: int

    def init_slots(self, enc: Any, beam: int, *, n_positions: int, source_len: int) -> Any: ...

    def decode_slots(
        self, prev_tokens: Tensor, rows: Tensor | None, cache: Any, window: int | None = None
    ) -> Tensor: ...


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def sentence_bucket(n_sentences: int) -> int:
    """Sentences rounded up to a power of two up to SENTENCE_STEP, beyond to a multiple of it: few buckets for
    small batches, and at most SENTENCE_STEP - 1 sentences of padding for the large ones of a token budget."""
    if n_sentences > SENTENCE_STEP:
        return round_up(n_sentences, SENTENCE_STEP)
    return 1 << max(n_sentences - 1, 0).bit_length()


def bucket_of(n_sentences: int, beam: int, n_steps: int, source_len: int, max_positions: int) -> Bucket:
    """The bucket of a batch: n_sentences sentences of up to source_len pieces, searched with `beam` rows each for at
    most n_steps steps."""
    assert n_steps <= max_positions, "a search never runs past the model's positions"
    n_positions = min(round_up(n_steps, POSITION_STEP), max_positions)
    return Bucket(sentence_bucket(n_sentences) * beam, n_positions, round_up(source_len, POSITION_STEP))


def window_of(position: int, n_positions: int) -> int:
    """The self-attention positions a step at `position` reads: its own and those before, rounded up to a multiple of
    WINDOW_STEP, within the bucket's n_positions."""
    return min(round_up(position + 1, WINDOW_STEP), n_positions)


@dataclass
class Captured:
    """One bucket's captured search step: its cache and search state (search/slot_state.py), the buffers its graphs
    read and write, and what replays the step for each window of positions (captured as a step first needs it)."""

    bucket: Bucket
    cache: SlotCacheLike  # the bucket's fixed-slot cache
    state: SlotState  # the bucket's search state
    capture: Callable[[int], Callable[[], None]]  # captures the step reading a window of positions -> its replay
    replays: dict[int, Callable[[], None]]  # by window
    batch: int = 0  # which batch's search owns the buffers now (one at a time: `step_for`)
    held: bool = False  # a batch's search holds the buffers: from `step_for` until it moves or ends

    def step(self, batch: int, position: int) -> SlotState:
        """Replay the search step at `position` (the cache's step) -> the state it left (the bucket's own buffers,
        which the next replay changes). batch: the number `step_for` gave the batch."""
        assert batch == self.batch, "a bucket's buffers hold one batch at a time; another one was loaded since"
        window = window_of(position, self.bucket.n_positions)
        replay = self.replays.get(window)
        if replay is None:  # a warm-up run of the step: the state and the rows' positions put back after it
            saved, steps = self.state.snapshot(), self.cache.steps()
            torch.arange(self.bucket.rows, out=self.state.rows)  # and no row of the cache reordered
            replay = self.replays[window] = self.capture(window)
            self.state.restore(saved)
            self.cache.restart(steps)
        replay()
        return self.state


class StepGraphs:
    """The captured steps of one model, by bucket (see the module's docstring)."""

    def __init__(self, capture: Capture, max_graphs: int = MAX_GRAPHS) -> None:
        self.capture = capture
        self.max_graphs = max_graphs
        self.graphs: OrderedDict[Bucket, list[Captured]] = OrderedDict()  # a bucket's captures, held or free
        self.n_captures = 0
        self.n_batches = 0

    def step_for(
        self, model: SlotModel, cache: SlotCacheLike, state: SlotState, bucket: Bucket, written: int = 0
    ) -> tuple[Captured, int]:
        """The captured step of `bucket`, with a batch's `cache` and `state` (of the bucket's shapes: new, or moved
        to the fewer slots of this bucket by their `select`, `written` positions in) loaded into it (captured over
        them when the bucket has none free), and the batch's number for `Captured.step`. The batch holds the
        captured step (`Captured.held`) until it sets `held` back to False: while it does, another batch of the
        bucket gets a capture of its own, so that two searches stepped in turn (serve's) never share buffers."""
        copies = self.graphs.get(bucket, [])
        captured = next((c for c in copies if not c.held), None)
        if captured is not None:
            captured.cache.load(cache, written)
            captured.state.load(state)
        else:
            captured = self.record(model, cache, state, bucket)
            copies = [*copies, captured]
        self.graphs[bucket] = copies
        self.graphs.move_to_end(bucket)
        if len(self.graphs) > self.max_graphs:  # a held step dropped here stays its batch's until that ends
            self.graphs.popitem(last=False)
        self.n_batches += 1
        captured.batch, captured.held = self.n_batches, True
        return captured, captured.batch

    def record(self, model: SlotModel, cache: SlotCacheLike, state: SlotState, bucket: Bucket) -> Captured:
        """The captured step over `cache`'s and `state`'s buffers, its windows captured as steps need them
        (`Captured.step`)."""
        assert state.rows.shape[0] == bucket.rows, "a bucket's state holds its rows"

        def capture(window: int) -> Callable[[], None]:
            self.n_captures += 1
            logger.debug("capturing the search step of %s over %d positions (%d)", bucket, window, self.n_captures)
            return self.capture(lambda: search_step(model, cache, state, window))

        return Captured(bucket, cache, state, capture, {})


def run_eagerly(run: Callable[[], None]) -> Callable[[], None]:
    """The `Capture` without CUDA graphs (the CPU, --no-cuda-graphs): a replay runs the step again."""
    return run


class CudaCapture:
    """Captures a run as a CUDA graph (a `Capture`), every graph in one memory pool: a step's tensors are made and
    freed within its replay, and the search replays one graph at a time, so they can share their memory."""

    def __init__(self) -> None:
        self.pool: Any = None

    def __call__(self, run: Callable[[], None]) -> Callable[[], None]:
        """Capture `run` after one warm-up run on a side stream (lazy initialisations stay out of the graph). Under
        autocast the casts of the weights are captured too: autocast's cast cache, emptied when the step's autocast
        ends, would free tensors the graph reads."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        with torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=False):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                run()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # other threads' CUDA calls may go on
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                run()
        return graph.replay
