"""Training batches prepared ahead of the loop: collated, and on CUDA pinned, by a background thread that keeps up
to `depth` of them in a queue, so that the GPU does not wait on the host's padding and copying. The trainer tells it
where the loop stands (`plan`) and takes what it asks for (`get`); a request off the plan (a new epoch, a resume, a
test's own batches) is collated inline and the thread restarted. Which batches are trained on, and in what order,
stays the loop's."""

from __future__ import annotations

import queue
import threading
import weakref
from dataclasses import replace

import numpy as np
import torch

from nmt_cli.data.batching import Batch, collate
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.data.vocab import PAD


def prepare(dataset: ParallelDataset, ids: np.ndarray, device: torch.device, bucket_limit: int = 0) -> Batch:
    """collate() (to bucketed lengths with bucket_limit); for CUDA also what would otherwise cost a device sync: the
    flat positions of the real target tokens (`tgt_index`, for the loss), no source mask where no sentence is padded
    (so SDPA may choose its Flash kernel), and pinned memory."""
    batch = collate(dataset, ids, bucket_limit=bucket_limit)
    if device.type != "cuda":
        return batch
    index = torch.from_numpy(np.flatnonzero(batch.tgt_out.numpy().reshape(-1) != PAD))
    assert batch.src_pad_mask is not None  # collate() always sets it
    mask = batch.src_pad_mask if bool(batch.src_pad_mask.any()) else None  # a CPU tensor: no device sync
    batch = replace(batch, src_pad_mask=mask, tgt_index=index)
    if not torch.cuda.is_available():
        return batch
    names = ("src_tokens", "src_pad_mask", "tgt_in", "tgt_out", "tgt_index")
    return replace(
        batch, **{name: getattr(batch, name).pin_memory() for name in names if getattr(batch, name) is not None}
    )


def _work(
    dataset: ParallelDataset,
    device: torch.device,
    bucket_limit: int,
    order: list[np.ndarray],
    start: int,
    out: queue.Queue,
    stop: threading.Event,
) -> None:
    """Prepare order[start:] into `out` until the end of the order or until told to stop."""
    for ids in order[start:]:
        try:
            item: tuple[np.ndarray, Batch | BaseException] = (ids, prepare(dataset, ids, device, bucket_limit))
        except BaseException as e:  # handed to the loop, which raises it where collate would have
            item = (ids, e)
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        if stop.is_set() or isinstance(item[1], BaseException):
            return


def halt(stop: threading.Event, thread: threading.Thread) -> None:
    """Tell a loader's thread to stop, and wait until it has (at most one batch's preparing, or 0.1 s)."""
    stop.set()
    if thread is not threading.current_thread():
        thread.join()


class BatchLoader:
    """Prepared batches in the loop's order; background=False collates inline (the CPU default). bucket_limit: pad
    to bucketed lengths (`collate`), for batches made by `batch_by_shapes`."""

    def __init__(
        self, dataset: ParallelDataset, device: torch.device, background: bool, depth: int = 4, bucket_limit: int = 0
    ) -> None:
        self.dataset, self.device, self.background, self.depth = dataset, device, background, depth
        self.bucket_limit = bucket_limit
        self._order: list[np.ndarray] | None = None
        self._next = 0
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None  # each one stopped and joined when the loader goes (plan)

    def plan(self, order: list[np.ndarray], start: int) -> None:
        """The loop is about to take order[start], order[start + 1], ...: prepare them ahead."""
        if not self.background or (order is self._order and start == self._next):
            return
        self._stop.set()
        self._stop = stop = threading.Event()
        self._order, self._next, self._queue = order, start, queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(
            target=_work,
            args=(self.dataset, self.device, self.bucket_limit, order, start, self._queue, stop),
            daemon=True,
            name="nmt-batches",
        )
        self._thread.start()
        # Stopped and joined when the loader goes, or at the interpreter's exit (finalize's atexit) for a loader
        # still alive then, e.g. a script's Trainer: see close().
        weakref.finalize(self, halt, stop, self._thread)

    def close(self) -> None:
        """Stop the thread and wait for it: a daemon thread still pinning memory when the interpreter exits
        aborts the process ("terminate called without an active exception", seen on an H200 after training)."""
        if self._thread is not None:
            halt(self._stop, self._thread)
            self._thread = None
        self._order = self._queue = None

    def get(self, ids: np.ndarray) -> Batch:
        """The prepared batch of `ids`: from the thread when it is the planned next one, else made now."""
        order, n = self._order, self._next
        if self._queue is None or order is None or n >= len(order) or order[n] is not ids:
            self._order = None  # off the plan: the next plan() restarts the thread
            return prepare(self.dataset, ids, self.device, self.bucket_limit)
        self._next += 1
        planned_ids, batch = self._queue.get()
        assert planned_ids is ids
        if isinstance(batch, BaseException):
            self._order = None
            raise batch
        return batch
