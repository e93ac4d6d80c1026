"""`nmt` with one fault injected into one rank, for the data-parallel failure tests.

Run as `torchrun ... tests/train/faults.py train ...` with NMT_TEST_FAULT=KIND:RANK:UPDATE, where
KIND is oom (out of memory in a forward), nan (a non-finite loss), oom-backward (out of memory in
the backward that synchronises the ranks), hang (the rank stops answering), clock (the rank's clock runs
an hour ahead a second, from the start; UPDATE unused) or none.

Every run also checks that no DistributedDataParallel wrapper is alive when the process group is
destroyed (see runtime.shutdown_distributed: a DDP reducer that outlives the group can deadlock its
rank at exit), and prints "ddp wrappers alive at shutdown: N".
"""

import gc
import os
import signal
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel

import nmt_cli.commands.train as command
import nmt_cli.train.loop as loop
from nmt_cli.cli import main
from nmt_cli.train.trainer import Trainer

KIND, RANK, UPDATE = os.environ["NMT_TEST_FAULT"].split(":")


fired = []


def hit(trainer: Trainer, kind: str) -> bool:
    """True once: in the first training batch of the given update, on the given rank."""
    if kind != KIND or fired or not trainer.model.training:
        return False
    if trainer.info.rank != int(RANK) or trainer.state.update + 1 != int(UPDATE):
        return False
    fired.append(True)
    return True


batch_loss, backward = Trainer.batch_loss, Trainer.backward


def faulty_batch_loss(self, batch, module=None):
    if hit(self, "oom"):
        raise torch.cuda.OutOfMemoryError("injected")
    if hit(self, "hang"):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # so that the launcher can end this rank at once
        time.sleep(600)
    loss, nll = batch_loss(self, batch, module)
    return (loss * float("nan"), nll) if hit(self, "nan") else (loss, nll)


def faulty_backward(self, loss):
    if hit(self, "oom-backward"):
        raise torch.cuda.OutOfMemoryError("injected")
    backward(self, loss)


shutdown_distributed = command.shutdown_distributed


def checked_shutdown_distributed():
    gc.collect()
    alive = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    print(f"ddp wrappers alive at shutdown: {alive}", file=sys.stderr)
    shutdown_distributed()


class FastClock:
    """time for nmt_cli.train.loop on the clock rank: monotonic() runs 3,600 times too fast."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def monotonic(self) -> float:
        return self.start + (time.monotonic() - self.start) * 3600

    def __getattr__(self, name):
        return getattr(time, name)


Trainer.batch_loss, Trainer.backward = faulty_batch_loss, faulty_backward
if KIND == "clock" and os.environ.get("RANK") == RANK:
    loop.time = FastClock()
command.shutdown_distributed = checked_shutdown_distributed

if __name__ == "__main__":
    main()
