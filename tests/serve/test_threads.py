"""serve's --threads default: every core the process may use (its CPU affinity, which torch's own default does not
read); a --threads given is kept. The affinity is mocked, so the cases run on any machine."""

import os

import pytest
import torch

from nmt_cli.commands.serve import serving_threads, set_serving_threads


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 2), (16, 16)])
def test_default_is_the_cores_this_process_may_use(monkeypatch, cores, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert serving_threads(0) == threads


@pytest.mark.parametrize("cores", [1, 2, 16])
def test_threads_given_are_kept(monkeypatch, cores):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert serving_threads(3) == 3


def test_without_affinity_the_machine_cores_count(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert serving_threads(0) == 4


def test_the_chosen_number_is_set_and_described(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    before = torch.get_num_threads()
    try:
        chosen = set_serving_threads(0)
        assert torch.get_num_threads() == 3
        given = set_serving_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert chosen == "searching with 3 CPU thread(s) (--threads 0: the 3 core(s) this process may use)"
    assert given == "searching with 1 CPU thread(s) (--threads)"
