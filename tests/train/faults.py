"""`nmt` with one fault injected into one rank, for the data-parallel failure tests.

Run as `torchrun ... tests/train/faults.py train ...` with NMT_TEST_FAULT=KIND:RANK:UPDATE, where
KIND is oom (out of memory in a forward), nan (a non-finite loss), oom-backward (out of memory in
the backward that synchronises the ranks) or hang (the rank stops answering).
"""

import os
import signal
import time

import torch

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


Trainer.batch_loss, Trainer.backward = faulty_batch_loss, faulty_backward

if __name__ == "__main__":
    main()
