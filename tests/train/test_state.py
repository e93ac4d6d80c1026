"""TrainState: the counters resume restores move only through its methods."""

import pytest

from nmt_cli.train.state import TrainState

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_counters_advance_through_the_methods():
    s = TrainState()
    s.consume_batches(2)
    s.advance_update()
    assert (s.update, s.epoch, s.batch_in_epoch, s.logged_epoch) == (1, 1, 2, 1)
    s.next_epoch()
    assert (s.update, s.epoch, s.batch_in_epoch, s.logged_epoch) == (1, 2, 0, 1)  # the save belongs to epoch 1
    s.consume_batches(3)
    s.restart_epoch()
    s.restart_schedule()
    assert (s.epoch, s.batch_in_epoch, s.lr_start) == (2, 0, 1)


def test_from_saved_keeps_defaults_for_what_an_older_checkpoint_lacks():
    saved = {"update": 7, "epoch": 3, "batch_in_epoch": 4}  # no train_data, best_metric (older checkpoints)
    assert TrainState.from_saved(saved) == TrainState(update=7, epoch=3, batch_in_epoch=4)
